"""Placeholder until the webshop environment lands: registers nothing."""


def register() -> None:
    return None
