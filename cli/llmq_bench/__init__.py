"""The benchmark library the ``llmq`` command runs (``llmq bench``, ``simulate``, ``capacity``, ``demo``): prompts,
load generators, the fleet simulator and capacity model, the capacity curve, the pipeline and timeline measurements,
and the Ray Serve peer they compare with. Above the services (the simulator runs the batcher's policy), below the CLI
(which starts the stacks it measures). The scripts and recorded results stay in the checkout's ``bench/``."""
