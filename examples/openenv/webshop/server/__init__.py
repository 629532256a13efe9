"""The OpenEnv server of WebShop-v0."""
