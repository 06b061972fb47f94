"""`ggpo-batch config`: the effective settings and their sources (ggpo_batch/config/settings_view.py)."""

from __future__ import annotations

import click

from .app import App, cli, echo_json, pass_app


@cli.command("config")
@click.option("--json", "as_json", is_flag=True, help="The settings and their sources as JSON.")
@pass_app
def config_command(app: App, as_json: bool) -> None:
    """Print every setting as the commands will use it, and where it came from: the environment
    (GGPO_*), a settings file, or the default. Passwords and tokens are masked.

    \b
    Settings files (TOML), each overriding the one before, the environment overriding both:
      /etc/ggpo-batch/config.toml             the site's (readable by everyone)
      ~/.config/ggpo-batch/config.toml        yours (XDG_CONFIG_HOME honoured)
    GGPO_CONFIG=FILE reads that file instead of both. A key is its variable without GGPO_, lower
    case; a table adds its name:
    \b
      queue = "team-a"                        # GGPO_QUEUE
      queue_gpu_quota = 8                     # GGPO_QUEUE_GPU_QUOTA
      db_url_file = "db-url"                  # GGPO_DB_URL_FILE: a 0600 file, relative to this one
      [notify]
      smtp_host = "mail.example.org"          # GGPO_NOTIFY_SMTP_HOST
      email_to = ["ml-team@example.org"]      # GGPO_NOTIFY_EMAIL_TO
    \b
    Secrets (passwords, tokens, webhook URLs, a URL with a password) are refused in a settings
    file: put each in a file only you can read (chmod 600) and name it with the `_file` key.
    Exit codes: 0 shown; 2 a setting or a settings file is wrong (the line names file and key).
    """
    from ..config.settings_view import effective_settings

    data = effective_settings()
    if as_json:
        echo_json("config", data)
        return
    for f in data["files"]:
        click.echo(f"settings file ({f['role']}): {f['path']}" + ("" if f["found"] else " (none)"))
    rows = [(r["key"], _text(r["value"]), _source(r)) for r in data["settings"]]
    width = [max(len(row[i]) for row in rows) for i in (0, 1)]
    for key, value, source in rows:
        click.echo(f"{key:<{width[0]}}  {value:<{min(width[1], 60)}}  {source}")


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)


def _source(row: dict) -> str:  # type: ignore[type-arg]
    if row["source"] == "env":
        return f"env {row['set_by']}"
    if row["source"] == "file":
        return f"file {row['file']} ({row['set_by']})"
    return "default"
