"""pdserve's common Python code: the engine core shared by every service role."""
