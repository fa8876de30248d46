"""Changes in a directory of the sandbox, from the host side: inotify on a directory fd
resolved inside the sandbox's root (runtime/files.py), so no path of the caller's is
ever looked up by name; events are bounded and pulled (next_events, get_new_events, or
iteration)."""

from __future__ import annotations

import os
import posixpath

from .._record import Record
from ..linux.openat2 import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    KERNEL_FS,
    RESOLVE_BENEATH,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
    fs_type,
    inotify_events,
    inotify_init,
    inotify_unwatch,
    inotify_watch_fd,
    openat2,
)
from .files import _DIR, MAX_DEPTH, Files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Self


#: one read of an inotify fd (the kernel's own queue, fs.inotify.max_queued_events, is the
#: bound on what waits: past it the kernel drops events and says so, reported as "overflow")
WATCH_READ = 1 << 16


#: directories one recursive watch follows
MAX_WATCHES = 1024


class FilesystemEvent(Record):
    """A change seen by watch(): type "add", "modify", "remove", "rename" (the old name; its
    new name comes as an "add"), "chmod", or "overflow" (the kernel dropped events: list
    again). name: relative to the watched directory."""

    type: str
    name: str
    path: str


#: inotify events a watch asks for, and what each is called
_WATCH_MASK = (IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_DELETE | IN_MOVED_FROM
               | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)


_EVENT_TYPES = ((IN_CREATE | IN_MOVED_TO, "add"), (IN_MODIFY, "modify"),
                (IN_DELETE, "remove"), (IN_MOVED_FROM, "rename"), (IN_ATTRIB, "chmod"))


class Watcher:
    """Changes under one directory of the sandbox (Files.watch). `get_new_events()` returns
    what happened since the last call without waiting; iterating waits for each next one
    (`next_events(timeout)` waits at most timeout seconds). "modify" is a write to the
    file (back-to-back ones reported once). The queue is the kernel's (bounded: past it, an "overflow"
    event). Ends when stop() is called or the directory goes (its "remove" event last).

    The directory is opened like any other path (openat2 inside the root) and watched as
    /proc/self/fd/N of that fd (inotify takes only a path; that magic link is to the inode
    already held, see linux.openat2.inotify_watch_fd), as the sandbox's user."""

    def __init__(self, files: Files, p: str, recursive: bool) -> None:
        self.path = p
        self.recursive = recursive
        self._files = files
        self._ifd = inotify_init()
        self._wds: dict[int, str] = {}    # watch -> its directory, relative to p
        self._fds: dict[int, int] = {}    # watch -> the O_PATH fd it was added on
        self.done = False
        try:
            with files._ids():
                fd = files._open(p, _DIR)
                self._add(fd, "")
                if recursive:
                    self._add_tree(fd, "")
        except OSError as e:
            self.stop()
            raise files._fail(e, p, "watch") from None
        except BaseException:
            self.stop()
            raise

    def _add(self, fd: int, rel: str) -> bool:
        """Watch the directory held by fd (taken over: closed with the watch, or now when
        the watch already follows MAX_WATCHES directories: False then, and fd is no
        longer ours to use; its number may be another thread's already)."""
        if len(self._wds) >= MAX_WATCHES:
            os.close(fd)
            return False
        try:
            wd = inotify_watch_fd(self._ifd, fd, _WATCH_MASK)
        except BaseException:
            os.close(fd)
            raise
        self._wds[wd] = rel
        old = self._fds.pop(wd, None)
        if old is not None:
            os.close(old)
        self._fds[wd] = fd
        return True

    def _add_tree(self, fd: int, rel: str, level: int = 0) -> None:
        if level >= MAX_DEPTH or len(self._wds) >= MAX_WATCHES:
            return
        rd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with os.scandir(rd) as it:
                subs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        finally:
            os.close(rd)
        for name in subs:
            if len(self._wds) >= MAX_WATCHES:
                return
            self._add_child(fd, rel, name, level)

    def _add_child(self, fd: int, rel: str, name: str, level: int) -> None:
        try:
            sub = openat2(fd, name, _DIR | os.O_NOFOLLOW, RESOLVE_BENEATH
                          | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        except OSError:
            return
        if fs_type(sub) in KERNEL_FS:
            os.close(sub)
            return
        child = posixpath.join(rel, name)
        if self._add(sub, child):
            self._add_tree(sub, child, level + 1)

    def get_new_events(self) -> list[FilesystemEvent]:
        return self.next_events(0)

    def next_events(self, timeout: float | None = None) -> list[FilesystemEvent]:
        """The events waiting, after waiting up to timeout seconds (None: until one comes)
        for the first. Empty on timeout, or once the watch has ended."""
        import select

        if self.done:
            return []
        poller = select.poll()
        poller.register(self._ifd, select.POLLIN)
        if not poller.poll(None if timeout is None else int(timeout * 1000)):
            return []
        try:
            data = os.read(self._ifd, WATCH_READ)
        except BlockingIOError:
            return []
        return self._decode(data)

    def _decode(self, data: bytes) -> list[FilesystemEvent]:
        out = []
        for wd, mask, _, raw in inotify_events(data):
            if mask & IN_Q_OVERFLOW:
                out.append(FilesystemEvent("overflow", "", self.path))
                continue
            rel = self._wds.get(wd)
            if rel is None:
                continue
            if mask & IN_IGNORED:   # the kernel dropped the watch (its directory went)
                self._wds.pop(wd, None)
                fd = self._fds.pop(wd, None)
                if fd is not None:
                    os.close(fd)
                if not self._wds:
                    self.done = True
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                if rel == "":
                    out.append(FilesystemEvent("remove", "", self.path))
                continue
            name = posixpath.join(rel, os.fsdecode(raw))
            for bits, kind in _EVENT_TYPES:
                if mask & bits:
                    ev = FilesystemEvent(kind, name, posixpath.join(self.path, name))
                    if not out or out[-1] != ev:
                        out.append(ev)
                    break
            if (self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO)
                    and wd in self._fds):
                try:
                    with self._files._ids():
                        self._add_child(self._fds[wd], rel, os.fsdecode(raw), 0)
                except OSError:
                    pass
        return out

    def __iter__(self) -> Iterator[FilesystemEvent]:
        while not self.done:
            yield from self.next_events(None)

    def stop(self) -> None:
        self.done = True
        for wd in list(self._wds):
            inotify_unwatch(self._ifd, wd)
        for fd in self._fds.values():
            os.close(fd)
        self._wds.clear()
        self._fds.clear()
        if self._ifd >= 0:
            os.close(self._ifd)
            self._ifd = -1

    close = stop

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
