"""Tensor and pipeline parallelism: how a model is split across worker processes.

`config.py` says how many ranks and checks the model allows it; `groups.py` holds one worker's
place in the grid and its torch.distributed groups; `sharding.py` cuts a checkpoint's weights
into one rank's shard; `layers.py` holds the layers that talk across ranks; `shard_loader.py`
builds one rank's model; `stage_forward.py` runs one pipeline stage's layers.
"""
