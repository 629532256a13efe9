"""The OpenEnv server of ALFWorld-v0."""
