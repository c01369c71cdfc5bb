"""The training commands: draft heads (train-heads, eval-heads, import-heads) and the draft layer (draft-data,
train-draft)."""

from __future__ import annotations

import argparse

from tokenswift.cli.common import CliError


def add_commands(sub) -> None:
    """train-heads, eval-heads, import-heads, draft-data and train-draft: their flags live beside their code
    (tokenswift/train/)."""
    from tokenswift.train import draft_data, eval_heads, head_config, import_heads, train_draft, train_heads

    train = sub.add_parser("train-heads", help="train draft heads on text or on the model's own output")
    head_config.add_arguments(train)
    train.set_defaults(func=lambda args: heads_command(train_heads.run, args))
    ev = sub.add_parser("eval-heads", help="per-head top-1/top-3 accuracy and loss on held-out text")
    eval_heads.add_arguments(ev)
    ev.set_defaults(func=lambda args: heads_command(eval_heads.run, args))
    imp = sub.add_parser("import-heads", help="import the heads of an official TokenSwift checkpoint")
    import_heads.add_import_arguments(imp)
    imp.set_defaults(func=lambda args: heads_command(import_heads.run_import, args))
    data = sub.add_parser("draft-data", help="run the model over book text once and store its states and "
                                             "next-token distributions for draft-layer training (resumable)")
    draft_data.add_arguments(data)
    data.set_defaults(func=lambda args: heads_command(draft_data.run, args))
    train = sub.add_parser("train-draft", help="train the draft layer on draft-data by distillation (resumable)")
    train_draft.add_arguments(train)
    train.set_defaults(func=lambda args: heads_command(train_draft.run, args))


def heads_command(run, args: argparse.Namespace) -> int:
    """Bad data, settings or checkpoints become one error line (exit 2), like every other command."""
    from tokenswift.model.errors import ModelLoadError

    try:
        return run(args)
    except (ValueError, ModelLoadError, FileNotFoundError) as error:
        raise CliError(str(error)) from error
