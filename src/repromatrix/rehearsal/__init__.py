"""A rehearsal of the GPU lane on a host without GPUs: real registry, real pulls, real vLLM.

Every GPU-lane code path runs for real up to the device request: images named
``<registry>/vllm/vllm-openai:<tag>`` are pulled from a local OCI registry
(look-alikes built from the matching ``vllm-cpu`` image), the GPU render is
built on them, the model comes from a Hugging Face cache mounted the way the
GPU lane mounts it, and the harness and triage read real vLLM, which runs on
its CPU device because the cell's device request is left out. It checks the
plumbing, not GPU kernels.
"""
