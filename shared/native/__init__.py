"""C++ kernels compiled on first use for this machine's CPU and loaded through ctypes."""
