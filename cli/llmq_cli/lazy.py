"""Subcommands imported when they run, so one ``llmq`` command loads only its own dependencies (the openai SDK, the
dev stack, the simulator, ... cost seconds of imports together; ``llmq batch status`` needs one of them)."""

from __future__ import annotations

import importlib

import click
import typer
from typer.core import TyperGroup


def lazy_group(commands: dict[str, str]) -> type[TyperGroup]:
    """A Typer group class whose subcommands ``commands`` (name -> ``"module:attribute"``, a Typer app or a command
    function) are imported on first use, listed in the given order after the group's own."""

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx: click.Context) -> list[str]:
            return [*super().list_commands(ctx), *(name for name in commands if name not in self.commands)]

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            if cmd_name not in self.commands and cmd_name in commands:
                self.add_command(_load(cmd_name, commands[cmd_name]), cmd_name)
            return super().get_command(ctx, cmd_name)

    return LazyGroup


def _load(name: str, target: str) -> click.Command:
    module, attribute = target.split(":")
    found = getattr(importlib.import_module(module), attribute)
    if isinstance(found, typer.Typer):
        command: click.Command = typer.main.get_group(found)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(found)
        command = typer.main.get_command(single)
    command.name = name
    return command
