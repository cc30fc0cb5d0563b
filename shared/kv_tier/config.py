"""Settings of the KV tiers below an engine's block pool (plain data: it crosses into the
engine-core process inside the EngineConfig)."""

from dataclasses import dataclass

DEFAULT_HOST_DIR = "/dev/shm"
# Until measured (`pdserve profile`), a block is assumed to load in this long from each tier:
# conservative figures of this 2-core CPU machine (a 360 KiB SmolLM2 block: copy + CRC-32).
DEFAULT_LOAD_SECONDS_PER_BLOCK = {"host": 4e-4, "file": 1e-3}
# ... and a prompt token to compute in this long (bf16 SmolLM2 prefill here: ~0.85 ms).
DEFAULT_COMPUTE_SECONDS_PER_TOKEN = 8e-4


@dataclass(frozen=True)
class KVTierConfig:
    """Which tiers an engine keeps below its pool, where, and how big (0 bytes: tier off)."""
    host_bytes: int = 0                 # shared memory of this host (an arena file in host_dir)
    host_dir: str = DEFAULT_HOST_DIR
    file_bytes: int = 0                 # a memory-mapped file on local disk, below the host tier
    file_dir: str = ""                  # "" = <pdserve cache dir>/kv-tier
    # Store a request's computed blocks when its blocks are freed (finish, abort, preemption),
    # not only when the pool evicts them: a decode instance's conversation (prompt and output)
    # is then in the host tier for the next turn's prefill at once.
    write_through: bool = True
    # Measured load and compute costs (pdserve profile); None: the defaults above, until the
    # engine has measured its own.
    host_load_seconds_per_block: float | None = None
    file_load_seconds_per_block: float | None = None
    compute_seconds_per_token: float | None = None

    @property
    def is_enabled(self) -> bool:
        return self.host_bytes > 0 or self.file_bytes > 0
