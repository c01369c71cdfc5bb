"""Errors the engine raises for bad checkpoints, so callers can catch one type and show its message."""


class ModelLoadError(RuntimeError):
    """A model, tokenizer or draft-head checkpoint could not be found or read; the message says which."""


def read_config_and_weights(directory, config_name: str, weights_name: str, error: type[ModelLoadError],
                            what: str) -> tuple[dict, dict]:
    """A drafter's two files (JSON config, safetensors weights), or `error` naming the folder and what is wrong."""
    import json

    from safetensors.torch import load_file

    config_file, weights_file = directory / config_name, directory / weights_name
    if not config_file.is_file() or not weights_file.is_file():
        raise error(f"no {what} in {directory}: expected {config_name} and {weights_name}")
    try:
        return json.loads(config_file.read_text()), load_file(str(weights_file))
    except Exception as failure:  # noqa: BLE001 - a corrupt or truncated file must name itself
        raise error(f"corrupt {what} file in {directory}: {failure}") from failure
