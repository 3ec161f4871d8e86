"""The policy server role: a vLLM engine serving the policy over ZeroMQ (server.py, the process;
engine.py, the engine; worker_ext.py, what runs inside vLLM's workers; weight_receiver.py, the
learner's weights as they arrive)."""
