"""Rollout engines behind one interface (`sampler`): the torch sampler, vLLM (`vllm_backend`,
`vllm_worker`), the multi-turn episode protocol (`environment`) and episodes at engine speed
(`continuous`, `vllm_turns`).
"""
