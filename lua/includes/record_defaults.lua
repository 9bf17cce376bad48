-- A record leaves out a field while it holds dtq's default (docs/design.md, "Task record"):
-- attempt, retries and intr while 0, maxr while DEFAULT_MAX_RETRIES, prio while
-- DEFAULT_PRIORITY (dtq/record.py), result while the result is null. Every reader reads an
-- absent one as that default.
local DEF_MAXR, DEF_PRIO = '3', '5'
