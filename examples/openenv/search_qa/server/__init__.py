"""The OpenEnv server of SearchQA-v0."""
