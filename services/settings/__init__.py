"""The one settings system of every pdserve process: a settings class whose fields are each a
flag, a PDSERVE_* variable and a settings-file key (service_settings, flags), the flags of the
engine's settings for commands that build an engine in-process (engine_flags), and the Redis
client settings every serving process shares (redis_client). Each service keeps its own
settings class: services.instance.settings, services.gateway.settings, services.planner.flags.
"""
