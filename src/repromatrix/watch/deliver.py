"""Every kept answer sent to each channel that has not taken it yet, at most so many rounds.

An answer is kept (``watch/answers/<key>.<stage>.json``) with the channels it
was delivered to and the rounds each was tried in. Each round sends it to every
configured channel that has not taken it; a channel that fails is tried again
next round, up to ``MAX_ROUNDS`` rounds, then given up (and said so). A
failure is reported, never raised: the grading it reports on stands.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from repromatrix.http_calls import Delivery
from repromatrix.watch.notify import Channels, GitHubIssues, Webhook
from repromatrix.watch.state import WatchFolder, read_json, write_json

MAX_ROUNDS = 24  # an hourly watch keeps trying a day


def deliver_all(
    folder: WatchFolder, channels: Channels, note: Callable[[str], None]
) -> tuple[tuple[str, ...], int]:
    """Send what earlier rounds still owe, oldest answer first; the lines said, and how many
    deliveries are still owed (to be tried next round)."""
    lines: list[str] = []
    owed = 0
    made = [
        (str(k.get("made_at", "")), path) for path in folder.answers() if (k := read_json(path))
    ]
    for _, path in sorted(made):
        said, left = deliver_one(folder, path, channels, note)
        lines += said
        owed += left
    return tuple(lines), owed


def deliver_one(
    folder: WatchFolder, path: Path, channels: Channels, note: Callable[[str], None]
) -> tuple[list[str], int]:
    """Send one kept answer to each configured channel that has not taken it."""
    kept = read_json(path)
    if kept is None:
        return [], 0
    lines: list[str] = []
    owed = 0
    for channel in (c for c in (channels.webhook, channels.github) if c is not None):
        line, done = _send(folder, kept, channel)
        if line:
            lines.append(line)
            note(line)
        owed += 0 if done else 1
    write_json(path, kept)
    return lines, owed


def _send(
    folder: WatchFolder, kept: dict[str, Any], channel: Webhook | GitHubIssues
) -> tuple[str, bool]:
    """One answer to one channel, unless it took it or was tried ``MAX_ROUNDS`` rounds."""
    delivered: dict[str, str] = kept.setdefault("delivered", {})
    attempts: dict[str, int] = kept.setdefault("attempts", {})
    name = channel.name
    if name in delivered:
        return "", True
    tried = int(attempts.get(name, 0))
    if tried >= MAX_ROUNDS:
        return "", True  # given up (said when it happened)
    attempts[name] = tried + 1
    delivery = _deliver(folder, kept, channel)
    where = f"{kept.get('title', kept.get('key'))} -> {name}"
    if delivery.ok:
        delivered[name] = delivery.words
        return f"answer sent: {where}: {delivery.words}", True
    left = MAX_ROUNDS - tried - 1
    later = f"; tried again next round ({left} left)" if left else "; given up"
    return f"warning: answer not sent: {where}: {delivery.words}{later}", not left


def _deliver(
    folder: WatchFolder, kept: dict[str, Any], channel: Webhook | GitHubIssues
) -> Delivery:
    delivery_id = f"{kept['key']}.{kept['stage']}"
    if isinstance(channel, Webhook):
        return channel.send(kept["payload"], delivery_id)
    issues = read_json(folder.issues) or {}
    tag = f"{kept['lane']}/{kept['tag']}"
    delivery, number = channel.send(str(kept["title"]), str(kept["markdown"]), issues.get(tag))
    if number is not None and issues.get(tag) != number and channel.issue is None:
        write_json(folder.issues, {**issues, tag: number})
    return delivery
