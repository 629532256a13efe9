"""Tests of agentgym_opsd.credit: the properties of docs/method.md, hand-computed cases, and fast == slow reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.credit import (
    ESTIMATORS,
    VARIANTS,
    CreditConfig,
    agentopsd_advantages,
    agentopsd_token_advantages,
    grpo_advantages,
    reference_agentopsd_advantages,
    register_estimator,
    turn_advantages,
)

F64 = torch.float64
FAST = settings(max_examples=40, deadline=None)


# ------------------------------------------------------------------------------------------------ helpers


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@st.composite
def turn_batches(draw, max_traj: int = 6, max_turns: int = 8, allow_zero_adv: bool = True):
    """Shuffled turn rows of a few trajectories with arbitrary (non-contiguous) traj and turn ids."""
    # Dense ids take the counting-sort layout, sparse ids the torch.sort one: draw both.
    dense_ids = draw(st.booleans())
    id_range = st.integers(0, 12) if dense_ids else st.integers(-(10**6), 10**6)
    num_traj = draw(st.integers(1, max_traj))
    traj_ids = draw(st.lists(id_range, min_size=num_traj, max_size=num_traj, unique=True))
    adv_values = st.floats(-3, 3, allow_nan=False)
    if not allow_zero_adv:
        adv_values = adv_values.filter(lambda a: abs(a) > 1e-3)
    rows = []  # (adv, evidence, traj, turn, rate)
    for traj in traj_ids:
        num_turns = draw(st.integers(1, max_turns))
        turn_range = st.integers(0, 20) if dense_ids else st.integers(0, 1000)
        turns = sorted(draw(st.lists(turn_range, min_size=num_turns, max_size=num_turns, unique=True)))
        adv = draw(adv_values)
        rate = draw(st.floats(0, 1))
        for turn in turns:
            rows.append((adv, draw(st.floats(-6, 6, allow_nan=False)), traj, turn, rate))
    rows = draw(st.permutations(rows))
    adv, ev, traj, turn, rate = zip(*rows, strict=True)
    return (
        torch.tensor(adv, dtype=F64),
        torch.tensor(ev, dtype=F64),
        torch.tensor(traj, dtype=torch.long),
        torch.tensor(turn, dtype=torch.long),
        torch.tensor(rate, dtype=F64),
    )


configs = st.builds(
    CreditConfig,
    lam=st.floats(0, 1),
    band=st.floats(0.01, 0.99),
    gamma=st.floats(0.05, 1.0),
    eps0=st.floats(1e-4, 0.4),
    variant=st.sampled_from(VARIANTS),
)


def _kwargs(cfg: CreditConfig) -> dict:
    return dict(lam=cfg.lam, band=cfg.band, gamma=cfg.gamma, eps0=cfg.eps0, eps=cfg.eps, variant=cfg.variant)


# ------------------------------------------------------------------------------------------------ GRPO


def test_grpo_hand_computed():
    out = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64), torch.tensor([3, 3, 3, 3]))
    std = math.sqrt(4 * 0.25 / 3)  # unbiased
    expected = 0.5 / (std + 1e-6)
    torch.testing.assert_close(out, torch.tensor([expected, -expected, -expected, expected], dtype=F64))
    assert abs(expected - 0.8660) < 1e-3


def test_grpo_group_of_one_is_zero_and_groups_are_independent():
    rewards = torch.tensor([5.0, 1.0, 3.0, 7.0], dtype=F64)
    out = grpo_advantages(rewards, torch.tensor([42, 7, 7, -1]))
    assert out[0] == 0 and out[3] == 0
    assert out[1] < 0 < out[2]
    torch.testing.assert_close(out[1:3], torch.tensor([-1.0, 1.0], dtype=F64) / (math.sqrt(2) + 1e-6))


def test_grpo_without_std_normalisation():
    out = grpo_advantages(
        torch.tensor([1.0, 0.0, 0.0, 10.0], dtype=F64), torch.tensor([0, 0, 1, 1]), normalize_std=False
    )
    torch.testing.assert_close(out, torch.tensor([0.5, -0.5, -5.0, 5.0], dtype=F64))


def test_grpo_equal_rewards_give_zero():
    out = grpo_advantages(torch.full((8,), 10.0, dtype=F64), torch.zeros(8, dtype=torch.long))
    assert torch.equal(out, torch.zeros(8, dtype=F64))


# ------------------------------------------------------------------------------------------------ properties


@FAST
@given(turn_batches(), configs)
def test_vectorised_matches_reference_loop(batch, cfg):
    fast = agentopsd_advantages(*batch, **_kwargs(cfg))
    slow = reference_agentopsd_advantages(*batch, **_kwargs(cfg))
    assert fast.dtype == F64
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-9)


@FAST
@given(turn_batches(allow_zero_adv=False), configs)
def test_sign_preserved_and_magnitude_bounded(batch, cfg):
    adv = batch[0]
    out = agentopsd_advantages(*batch, **_kwargs(cfg))
    assert torch.equal(torch.sign(out), torch.sign(adv))
    low = (1 - cfg.lam * cfg.band) * adv.abs()
    high = (1 + cfg.lam * cfg.band) * adv.abs()
    assert bool((out.abs() >= low - 1e-12).all()) and bool((out.abs() <= high + 1e-12).all())


@FAST
@given(turn_batches(), configs)
def test_lambda_zero_is_grpo_exactly(batch, cfg):
    kwargs = {**_kwargs(cfg), "lam": 0.0}
    assert torch.equal(agentopsd_advantages(*batch, **kwargs), batch[0])


@FAST
@given(turn_batches(max_turns=1), configs)
def test_one_turn_trajectories_are_grpo_exactly(batch, cfg):
    assert torch.equal(agentopsd_advantages(*batch, **_kwargs(cfg)), batch[0])


@FAST
@given(turn_batches(), configs)
def test_zero_advantage_gives_zero(batch, cfg):
    adv, *rest = batch
    out = agentopsd_advantages(torch.zeros_like(adv), *rest, **_kwargs(cfg))
    assert torch.equal(out, torch.zeros_like(adv))


@FAST
@given(turn_batches(), configs, st.randoms(use_true_random=False))
def test_row_order_invariance(batch, cfg, rnd):
    perm = list(range(batch[0].numel()))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    out = agentopsd_advantages(*batch, **_kwargs(cfg))
    out_perm = agentopsd_advantages(*(t[perm] for t in batch), **_kwargs(cfg))
    torch.testing.assert_close(out_perm, out[perm], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("scale", "shift", "turn_step"),
    [(1, 0, 3), (1, -(10**12), 3), (7, 3, 3), (10**6, 5, 3), (2**60, -(2**61), 3), (2**60, 0, 10**15)],
    ids=["dense", "dense-shifted", "gaps", "sparse-traj", "huge-traj", "huge-traj-and-turn"],
)
def test_every_layout_path_agrees_with_the_reference(scale, shift, turn_step):
    # Dense ids are counted directly, sparse trajectory ids are made dense first, and when turn ids are
    # sparse as well the rows are ordered by a comparison sort.
    g = torch.Generator().manual_seed(3)
    num_traj, num_turns = 6, 9
    traj = torch.arange(num_traj).repeat_interleave(num_turns) * scale + shift
    turn = torch.arange(num_turns).repeat(num_traj) * turn_step + 100  # non-contiguous turn ids
    adv = torch.randn(num_traj, generator=g, dtype=F64).repeat_interleave(num_turns)
    rate = torch.rand(num_traj, generator=g, dtype=F64).repeat_interleave(num_turns)
    ev = torch.randn(traj.numel(), generator=g, dtype=F64) * 3
    perm = torch.randperm(traj.numel(), generator=g)
    batch = (adv[perm], ev[perm], traj[perm], turn[perm], rate[perm])
    expected = reference_agentopsd_advantages(*batch)
    torch.testing.assert_close(agentopsd_advantages(*batch), expected, rtol=0, atol=1e-12)
    dup = tuple(torch.cat([t, t[:1]]) for t in batch)  # one row repeated
    with pytest.raises(ValueError, match="duplicate"):
        agentopsd_advantages(*dup)


def test_float32_stays_float32_and_close_to_float64():
    g = torch.Generator().manual_seed(0)
    traj = torch.arange(20).repeat_interleave(50)
    turn = torch.arange(50).repeat(20)
    adv = torch.randn(20, generator=g, dtype=F64)[traj]
    ev = torch.randn(1000, generator=g, dtype=F64)
    rate = torch.rand(20, generator=g, dtype=F64)[traj]
    out64 = agentopsd_advantages(adv, ev, traj, turn, rate)
    out32 = agentopsd_advantages(adv.float(), ev.float(), traj, turn, rate.float())
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), out64, rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------------------------ hand-computed


def _two_turn_by_hand(
    a, e1, e2, rate, *, lam=0.5, band=0.2, gamma=0.95, eps0=1e-3, eps=1e-6, prior=None, signed=True
):
    b0 = min(max(rate, eps0), 1 - eps0) if prior is None else prior
    c1 = e1
    c2 = gamma * e1 + e2
    b1 = _sigmoid(_logit(b0) + c1)
    b2 = _sigmoid(_logit(b0) + c2)
    s = (a > 0) - (a < 0)
    q = [s * (b1 - b0), s * (b2 - b1)] if signed else [abs(b1 - b0), abs(b2 - b1)]
    # Two values: mean is their midpoint, population std is half their distance, so z = ±1 (up to eps).
    mean = (q[0] + q[1]) / 2
    std = abs(q[0] - q[1]) / 2
    w = [min(max(1 + band * (x - mean) / (std + eps), 1 - band), 1 + band) for x in q]
    return [a * ((1 - lam) + lam * wk) for wk in w]


def _run_two_turn(a, e1, e2, rate, **kwargs):
    return agentopsd_advantages(
        torch.tensor([a, a], dtype=F64),
        torch.tensor([e1, e2], dtype=F64),
        torch.tensor([11, 11]),
        torch.tensor([1, 2]),
        torch.tensor([rate, rate], dtype=F64),
        **kwargs,
    ).tolist()


def test_hand_computed_paper_success_case():
    # A successful trajectory (A=1) in a hard group (R̄=1/8): turn 1 raises the belief a lot, turn 2 less.
    out = _run_two_turn(1.0, 2.0, 0.5, 0.125)
    expected = _two_turn_by_hand(1.0, 2.0, 0.5, 0.125)
    assert out == pytest.approx(expected, abs=1e-12)
    # z = ±1 → w = 1 ± 0.2 → Ã = 1 · (0.5 + 0.5 · w) ≈ 1.1 and 0.9.
    assert out == pytest.approx([1.1, 0.9], abs=1e-5)


def test_hand_computed_failure_case_flips_the_credit():
    # A failed trajectory (A < 0): the turn that lowered the belief gets the larger blame.
    out = _run_two_turn(-0.8, 0.3, -2.0, 0.5, lam=1.0, band=0.5)
    expected = _two_turn_by_hand(-0.8, 0.3, -2.0, 0.5, lam=1.0, band=0.5)
    assert out == pytest.approx(expected, abs=1e-12)
    assert out == pytest.approx([-0.8 * 0.5, -0.8 * 1.5], abs=1e-5)


def test_hand_computed_variants():
    assert _run_two_turn(1.0, 2.0, 0.5, 0.125, variant="no_prior") == pytest.approx(
        _two_turn_by_hand(1.0, 2.0, 0.5, 0.125, prior=0.5), abs=1e-12
    )
    assert _run_two_turn(-1.0, 2.0, -0.5, 0.3, variant="unsigned") == pytest.approx(
        _two_turn_by_hand(-1.0, 2.0, -0.5, 0.3, signed=False), abs=1e-12
    )
    # raw_gap: q = sign(A)·e = [-1, 3] → turn 2 weighted up.
    assert _run_two_turn(2.0, -1.0, 3.0, 0.3, variant="raw_gap") == pytest.approx(
        [2.0 * 0.9, 2.0 * 1.1], abs=1e-5
    )


def test_prior_is_clipped_at_eps0():
    # R̄ = 1 clips to 1 − ε0; with the release ε0 the prior saturates harder.
    out_paper = _run_two_turn(1.0, -3.0, 1.0, 1.0)
    assert out_paper == pytest.approx(_two_turn_by_hand(1.0, -3.0, 1.0, 1.0), abs=1e-12)
    out_release = _run_two_turn(1.0, -3.0, 1.0, 1.0, gamma=1.0, eps0=1e-4)
    assert out_release == pytest.approx(
        _two_turn_by_hand(1.0, -3.0, 1.0, 1.0, gamma=1.0, eps0=1e-4), abs=1e-12
    )


# ------------------------------------------------------------------------------------------------ validation


def test_duplicate_turn_rows_are_rejected():
    args = (
        torch.ones(3, dtype=F64),
        torch.zeros(3, dtype=F64),
        torch.tensor([5, 5, 5]),
        torch.tensor([0, 1, 1]),
        torch.full((3,), 0.5, dtype=F64),
    )
    with pytest.raises(ValueError, match=r"duplicate \(traj_id, turn_id\) = \(5, 1\)"):
        agentopsd_advantages(*args)
    with pytest.raises(ValueError, match="duplicate"):
        reference_agentopsd_advantages(*args)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"evidence": torch.zeros(2, dtype=F64)}, "same length"),
        ({"evidence": torch.zeros(3, 1, dtype=F64)}, "1-D"),
        ({"traj_ids": torch.zeros(3, dtype=F64)}, "traj_ids must be an integer"),
        ({"seq_advantages": torch.ones(3, dtype=torch.long)}, "seq_advantages must be a floating"),
        ({"seq_advantages": torch.tensor([1.0, 2.0, 1.0], dtype=F64)}, "seq_advantages must be the same"),
        ({"variant": "tokens"}, "variant"),
        ({"lam": 1.5}, "lam"),
    ],
)
def test_invalid_inputs(change, message):
    kwargs = dict(
        seq_advantages=torch.ones(3, dtype=F64),
        evidence=torch.zeros(3, dtype=F64),
        traj_ids=torch.tensor([5, 5, 5]),
        turn_ids=torch.tensor([0, 1, 2]),
        success_rate=torch.full((3,), 0.5, dtype=F64),
    )
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        agentopsd_advantages(**kwargs)


def test_empty_input():
    empty = torch.zeros(0, dtype=F64)
    ids = torch.zeros(0, dtype=torch.long)
    assert agentopsd_advantages(empty, empty, ids, ids, empty).shape == (0,)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("lam", -0.1),
        ("lam", 1.1),
        ("band", 0.0),
        ("band", 1.0),
        ("gamma", 0.0),
        ("gamma", 1.5),
        ("eps0", 0.0),
        ("eps0", 0.5),
        ("eps", 0.0),
        ("variant", "nope"),
        ("lam", float("nan")),
    ],
)
def test_config_validation_names_the_field(field_name, value):
    with pytest.raises(ValueError, match=rf"CreditConfig\.{field_name}"):
        CreditConfig(**{field_name: value})


def test_presets():
    assert CreditConfig.PAPER == CreditConfig(
        lam=0.5, band=0.2, gamma=0.95, eps0=1e-3, eps=1e-6, variant="paper"
    )
    assert CreditConfig.RELEASE.gamma == 1.0 and CreditConfig.RELEASE.eps0 == 1e-4
    with pytest.raises(AttributeError):
        CreditConfig.PAPER.lam = 0.3  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------ registry


def _small_batch():
    g = torch.Generator().manual_seed(1)
    traj = torch.tensor([0, 0, 0, 1, 1, 2])
    turn = torch.tensor([0, 1, 2, 0, 1, 0])
    adv = torch.tensor([1.0, -0.5, 0.0], dtype=F64)[traj]
    rate = torch.tensor([0.25, 0.25, 0.75], dtype=F64)[traj]
    return adv, torch.randn(6, generator=g, dtype=F64), traj, turn, rate


def test_registry_names_and_dispatch():
    assert set(ESTIMATORS) >= {
        "grpo",
        "agentopsd",
        "agentopsd-raw_gap",
        "agentopsd-unsigned",
        "agentopsd-no_prior",
    }
    batch = _small_batch()
    assert torch.equal(turn_advantages("grpo", *batch, CreditConfig.PAPER), batch[0])
    assert torch.equal(turn_advantages("agentopsd", *batch, CreditConfig.PAPER), agentopsd_advantages(*batch))
    release = turn_advantages("agentopsd", *batch, CreditConfig.RELEASE)
    assert torch.equal(release, agentopsd_advantages(*batch, gamma=1.0, eps0=1e-4))
    for variant in VARIANTS[1:]:
        got = turn_advantages(f"agentopsd-{variant}", *batch, CreditConfig.PAPER)
        assert torch.equal(got, agentopsd_advantages(*batch, variant=variant))


def test_registry_errors():
    batch = _small_batch()
    with pytest.raises(ValueError, match=r"unknown estimator 'gae'; known: \[.*'agentopsd'.*'grpo'"):
        turn_advantages("gae", *batch, CreditConfig.PAPER)
    with pytest.raises(ValueError, match="fixes variant='unsigned'"):
        turn_advantages("agentopsd-unsigned", *batch, CreditConfig(variant="raw_gap"))
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda *args: args[0])
    with pytest.raises(TypeError):
        ESTIMATORS["mine"] = None  # type: ignore[index]


# ------------------------------------------------------------------------------------------------ token level


def _reference_token_advantages(adv, gaps, mask, rate, *, lam=0.5, band=0.2, gamma=0.95, eps0=1e-3, eps=1e-6):
    """Obvious per-row, per-token loop of the token-granularity variant."""
    out = torch.zeros(gaps.shape, dtype=F64)
    for row in range(gaps.shape[0]):
        cols = [t for t in range(gaps.shape[1]) if mask[row, t]]
        if not cols:
            continue
        a = float(adv[row])
        s = (a > 0) - (a < 0)
        b0 = min(max(float(rate[row]), eps0), 1 - eps0)
        c, b_prev, q = 0.0, b0, []
        for t in cols:
            c = gamma * c + float(gaps[row, t])
            b = min(max(_sigmoid(_logit(b0) + c), eps), 1 - eps)
            q.append(s * (b - b_prev))
            b_prev = b
        mean = sum(q) / len(q)
        std = math.sqrt(sum((x - mean) ** 2 for x in q) / len(q))
        for t, qt in zip(cols, q, strict=True):
            w = min(max(1 + band * (qt - mean) / (std + eps), 1 - band), 1 + band)
            out[row, t] = a * ((1 - lam) + lam * w)
    return out


@st.composite
def token_batches(draw, allow_zero_adv=True):
    rows = draw(st.integers(1, 5))
    tokens = draw(st.integers(1, 80))  # > 64 exercises the blocked scan
    adv = st.floats(-3, 3) if allow_zero_adv else st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3)
    adv_t = torch.tensor(draw(st.lists(adv, min_size=rows, max_size=rows)), dtype=F64)
    rate = torch.tensor(draw(st.lists(st.floats(0, 1), min_size=rows, max_size=rows)), dtype=F64)
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    gaps = torch.randn(rows, tokens, generator=g, dtype=F64) * 2
    mask = torch.rand(rows, tokens, generator=g) < draw(st.floats(0.0, 1.0))
    return adv_t, gaps, mask, rate


@FAST
@given(token_batches(), st.floats(0.05, 1.0), st.floats(0, 1), st.floats(0.01, 0.99))
def test_token_variant_matches_reference_and_respects_mask(batch, gamma, lam, band):
    adv, gaps, mask, rate = batch
    out = agentopsd_token_advantages(adv, gaps, mask, rate, gamma=gamma, lam=lam, band=band)
    assert out.shape == gaps.shape and out.dtype == F64
    assert bool((out[~mask] == 0).all())
    expected = _reference_token_advantages(adv, gaps, mask, rate, gamma=gamma, lam=lam, band=band)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-9)


@FAST
@given(token_batches(allow_zero_adv=False), st.floats(0, 1), st.floats(0.01, 0.99))
def test_token_variant_sign_and_bounds(batch, lam, band):
    adv, gaps, mask, rate = batch
    out = agentopsd_token_advantages(adv, gaps, mask, rate, lam=lam, band=band)
    full = adv[:, None].expand_as(out)
    assert torch.equal(torch.sign(out[mask]), torch.sign(full[mask]))
    mag = out[mask].abs()
    assert bool((mag >= (1 - lam * band) * full[mask].abs() - 1e-12).all())
    assert bool((mag <= (1 + lam * band) * full[mask].abs() + 1e-12).all())


def test_token_variant_single_valid_token_and_int_mask():
    adv = torch.tensor([0.7, -1.2], dtype=F64)
    gaps = torch.tensor([[9.0, 3.0, -4.0], [1.0, 2.0, 3.0]], dtype=F64)
    mask = torch.tensor([[0, 1, 0], [1, 1, 0]])
    out = agentopsd_token_advantages(adv, gaps, mask, torch.tensor([0.5, 0.5], dtype=F64))
    assert out[0].tolist() == [0.0, 0.7, 0.0]  # one valid token: exactly A
    assert out[1, 2] == 0
    torch.testing.assert_close(
        out, _reference_token_advantages(adv, gaps, mask.bool(), [0.5, 0.5]), rtol=0, atol=1e-12
    )
    with pytest.raises(ValueError, match="0 and 1"):
        agentopsd_token_advantages(adv, gaps, mask * 2, torch.tensor([0.5, 0.5], dtype=F64))
    with pytest.raises(ValueError, match=r"\(rows, tokens\)"):
        agentopsd_token_advantages(adv, gaps, mask[:, :2], torch.tensor([0.5, 0.5], dtype=F64))


def test_token_variant_equals_turn_level_on_one_full_row():
    # One row with every token valid is one trajectory whose "turns" are the tokens.
    g = torch.Generator().manual_seed(5)
    gaps = torch.randn(1, 150, generator=g, dtype=F64)
    adv, rate = torch.tensor([-0.7], dtype=F64), torch.tensor([0.375], dtype=F64)
    tokens = agentopsd_token_advantages(adv, gaps, torch.ones_like(gaps, dtype=torch.bool), rate, gamma=0.9)
    turns = agentopsd_advantages(
        adv.expand(150),
        gaps[0],
        torch.zeros(150, dtype=torch.long),
        torch.arange(150),
        rate.expand(150),
        gamma=0.9,
    )
    torch.testing.assert_close(tokens[0], turns, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("length", "gamma"), [(1, 0.5), (64, 0.95), (65, 0.95), (5000, 0.999), (5000, 0.3), (300, 1.0)]
)
def test_blocked_discounted_scan_matches_a_loop(length, gamma):
    # private, but it is the numerically delicate part
    from agentgym_opsd.credit.agentopsd import _discounted_cumsum

    x = torch.randn(3, length, generator=torch.Generator().manual_seed(length), dtype=F64)
    expected, c = torch.zeros_like(x), torch.zeros(3, dtype=F64)
    for k in range(length):
        c = gamma * c + x[:, k]
        expected[:, k] = c
    torch.testing.assert_close(_discounted_cumsum(x, gamma), expected, rtol=0, atol=1e-10)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6), st.floats(0.0, 1.0),
       st.sampled_from([1e-16, 1e-12, 1e-9, 1e-6, 1e-3, 0.1]), st.floats(0.0, 1.0))
def test_zero_evidence_gives_grpo_exactly_at_every_eps(turns: list[int], rate: float, eps: float, lam: float) -> None:
    # ΔB_1 is taken against σ(logit B_0), so no rounding noise is left for 1/(std + ε) to amplify.
    traj = torch.tensor([t for t, k in enumerate(turns) for _ in range(k)])
    turn = torch.tensor([j for k in turns for j in range(k)])
    seq = torch.tensor([(-1.0) ** t * (t + 1) for t in traj.tolist()], dtype=torch.float64)
    zeros = torch.zeros(len(traj), dtype=torch.float64)
    success = torch.full((len(traj),), rate, dtype=torch.float64)
    kw = dict(lam=lam, eps=eps, eps0=max(eps, 1e-3))
    assert torch.equal(agentopsd_advantages(seq, zeros, traj, turn, success, **kw), seq)
    ref = reference_agentopsd_advantages(seq, zeros, traj, turn, success, **kw)
    assert ref.tolist() == seq.tolist()
