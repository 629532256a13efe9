"""Placeholder until the alfworld environment lands: registers nothing."""


def register() -> None:
    return None
