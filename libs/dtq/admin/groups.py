"""Admin's fair-group operations (docs/groups.md): a queue's groups, hold and release one. The
SDK's clients do the work (dtq.sdk.groupops); here the queue must be a known one, as for every
queue operation (:class:`dtq.UnknownQueue` otherwise: the API's 404, the CLI's exit 1)."""

from __future__ import annotations

from dtq.admin.core import AdminCore
from dtq.admin.views import Page
from dtq.sdk.groupops import GROUP_PAGE, check_group


class GroupOps(AdminCore):
    """A queue's fair groups: their listing, hold (pause) and release (resume)."""

    async def list_groups(
        self, queue: str, *, cursor: str | None = None, limit: int = GROUP_PAGE
    ) -> Page:
        """A page of the queue's active groups, then its held idle ones (items: GroupInfo's
        fields as a dict). Bounded work per page (dtq.sdk.groupops): a page may be short, even
        empty, while ``next_cursor`` is set."""
        await self._require_queue(queue)
        page = await self.client.groups(queue, cursor=cursor, limit=limit)
        return Page([g.to_dict() for g in page.items], page.next_cursor, 0, page.examined)

    async def pause_group(self, queue: str, group: str) -> bool:
        """Hold ``group`` of the queue: none of its tasks starts; running ones finish. True if
        it changed."""
        check_group(group)
        await self._require_queue(queue)
        return await self.client.pause_group(queue, group)

    async def resume_group(self, queue: str, group: str) -> bool:
        """Release ``group`` of the queue. True if it was held."""
        check_group(group)
        await self._require_queue(queue)
        return await self.client.resume_group(queue, group)
