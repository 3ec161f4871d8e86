"""SPA (arXiv 2510.15047; code shiqichen17/SPA): a world-model warm start, then RL from it.

    empo2-spa collect [key=value ...]   the base policy (model.name) plays spa.episodes episodes on the
                                        training variations of replay_buffer.tasks in the world-model turn
                                        format (state estimate, reasoning, next-state prediction, action):
                                        <run_dir>/spa/episodes.jsonl, resumable
    empo2-spa sft [key=value ...]       the true states substituted into those turns, fine-tuned with the
                                        learner's model code: <run_dir>/spa/sft/step_<epoch>/ (an HF
                                        checkpoint), <run_dir>/spa/sft_report.json (held-out loss and
                                        next-state accuracy before and after), resumable by epoch
    empo2-spa all [key=value ...]       both
Then the RL stage from that checkpoint, in the usual action format (the tags are not asked for):
    empo2-run model.name=<run_dir>/spa/sft/step_<epochs> [preset=empo2|grpo ...] run_dir=<another dir>

Sockets: as empo2-eval's (the collection starts its own policy server(s) serving model.name, with
fixed weights, and plays through the env actors' client API: GenerateRequest -> GenerateResponse).

Run: `empo2-spa all run_dir=runs/spa 'replay_buffer.tasks=[find-living-thing]'` (profile=cpu's scale).
"""

from __future__ import annotations

import logging

from common.logs import setup_logging
from common.process import interrupt_on_sigterm
from pipeline.config import PipelineConfig


def main(argv: list[str], cfg: PipelineConfig) -> int:
    stage, overrides = argv[0], argv[1:]  # pipeline/cli.py puts the stage first (Role.stages)
    setup_logging("spa")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    interrupt_on_sigterm()  # `kill` takes the Ctrl-C path: the started servers are stopped
    try:
        if stage in ("collect", "all"):
            from spa.collect import collect

            collect(cfg, overrides)
        if stage in ("sft", "all"):
            from spa.sft import sft

            sft(cfg)
    except KeyboardInterrupt:
        print("[spa] interrupted; processes stopped; a rerun resumes", flush=True)
        return 130
    return 0
