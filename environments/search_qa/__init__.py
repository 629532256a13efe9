"""Placeholder until the search_qa environment lands: registers nothing."""


def register() -> None:
    return None
