"""The prefix-cached teacher pass gives the same log-probs as the plain teacher-forced pass."""

from __future__ import annotations

import pytest
import torch

from agentgym_opsd.trainer.logprobs import (
    batched_response_logprobs,
    prefix_shared_response_logprobs,
    shared_prefix_groups,
)


@pytest.fixture(scope="module")
def tiny():
    from agentgym_opsd.models.loading import load_policy_model

    return load_policy_model("tiny-random")


def _rows(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(5, 1000, (n,), generator=g).tolist()  # noqa: E731
    skills_a, skills_b = ids(60), ids(40)  # two task kinds: two shared system blocks
    prompts, responses = [], []
    for k in range(9):
        prompts.append((skills_a if k % 2 else skills_b) + ids(3 + 4 * k))
        responses.append(ids(1 + k % 5))
    prompts.append(ids(4))  # too short to share anything
    responses.append(ids(3))
    responses[3] = []  # an empty response is allowed
    return prompts, responses


def test_groups_share_the_longest_common_prefix():
    prompts, _ = _rows(0)
    groups = sorted(shared_prefix_groups(prompts), key=lambda g: -len(g[1]))
    assert [(n, len(i)) for n, i in groups] == [(40, 5), (60, 4), (3, 1)]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(("temperature", "max_rows"), [(1.0, 16), (0.7, 2)])
def test_prefix_cache_matches_plain_pass(tiny, temperature, max_rows, packed):
    """Left-padded after a copy of the prefix's cache repeated over the rows, or packed after the one-row cache."""
    model, tok = tiny
    prompts, responses = _rows(1)
    kw = dict(pad_id=tok.pad_token_id, temperature=temperature, max_rows=max_rows)
    plain = batched_response_logprobs(model, prompts, responses, **kw)
    cached = prefix_shared_response_logprobs(model, prompts, responses, packed=packed, **kw)
    for a, b, r in zip(plain, cached, responses, strict=True):
        assert a.shape == b.shape == (len(r),)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
