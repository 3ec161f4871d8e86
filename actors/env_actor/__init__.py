"""The env actor role: ScienceWorld episodes played with the served policy (episode.py, the episode
logic; prompts.py, the chat; worker.py, one env's sockets; process.py, the process)."""
