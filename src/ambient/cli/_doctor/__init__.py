"""The checks of ``ambient doctor``, one module per concern; the command itself is :mod:`ambient.cli.doctor`.

``findings`` (what a check returns, and the helpers every check shares), ``brain`` (the filesystem, the
configuration, the brain's files, leftover temp files), ``agents`` (what agents need to run: programs, the Claude
Code CLI, model keys, Landlock), ``daemon`` (is it up, with the file's settings, short of resources), ``state``
(claims, locks, run journals), ``human`` (escalations, their notifications, Telegram answers).

Private (``_doctor``): the CLI discovers its commands by module name and skips names with a leading underscore.
Each check imports what it reads inside its function, so that building the parser (``ambient --help``) stays cheap.
"""
