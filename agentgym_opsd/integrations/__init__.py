"""Our environments where the field trains: OpenEnv servers and TRL's `GRPOTrainer`.

- `openenv_env`: our environments as OpenEnv `Environment`s (typed action: the agent's text; typed
  observation: the text plus our `info`), `openenv_server`: the FastAPI app and `agentgym-opsd
  serve-openenv`, `openenv_client`: the matching OpenEnv `EnvClient`;
- `openenv_package`: an environment's OpenEnv folder (`openenv.yaml`, `server/app.py`; `agentgym-opsd
  openenv-package`);
- `openenv_session`: one session, in this process or on a server, behind the same reset/step (and as a
  gymnasium env, `SessionEnv`, for our rollout);
- `trl`: a `rollout_func` that plays TRL's prompts as our episodes (our prompts, our parser, our records);
  `trl_tools`: an `environment_factory`, our environments as one tool the model calls.

Nothing is imported here: `openenv-core` and `trl` are optional (`pip install -e ".[integrations]"`) and
heavy (OpenEnv's server package imports gradio), so each is imported only by the module that needs it.
"""

from __future__ import annotations

__all__: list[str] = []
