"""What the repository's own benchmarks share beyond `pdserve bench serve`'s load generator
(services/bench): network faults (`netfault`, iptables and an NFQUEUE delayer), memory faults
(`memory_cgroup`), process trees, and the soak run's load, samples, report and plots.
"""
