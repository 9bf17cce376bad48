-- include: emit
-- Append the events of one type that one call made for several tasks as ONE stream entry
-- (docs/design.md, "Event entries"): its tid field holds their tids, its attempt field their
-- attempts, each separated by one space, in the same order (worker and detail are the same for
-- all); an entry of one task is emit()'s. tids, attempts: tables of text, of the same length
-- (an empty one appends nothing).
local function emit_batch(events_key, maxlen, etype, tids, attempts, worker, detail)
  if #tids > 0 then  -- (table.concat of one element is that element: emit()'s format)
    emit(events_key, maxlen, etype, table.concat(tids, ' '), table.concat(attempts, ' '),
      worker, detail)
  end
end
