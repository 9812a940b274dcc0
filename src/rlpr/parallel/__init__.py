"""parallel: collectives (no-ops in one process) and the strategies registry (ddp, fsdp, deepspeed)."""
