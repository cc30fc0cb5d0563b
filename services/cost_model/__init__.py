"""What an engine instance costs on this machine, as `pdserve profile` measures it, with the
fitted cost models the planner, the simulator and the gateway's placement read.
"""
