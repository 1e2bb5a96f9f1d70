-- wrk script for bench/spoa/run.sh.
--
-- TRAFFIC=benign: four benign requests in turn (browser-like headers, GETs and a form POST).
-- TRAFFIC=mixed:  the same, with one attack after every four benign requests (20% attacks:
--                 SQL injection, XSS in a form body, path traversal, command injection; each
--                 is denied by CRS 3.3.4 at paranoia level 1).
--
-- Every request names Host shop.example.com (a numeric Host scores with CRS 920350).
-- At the end it prints one line, `RESULT {json}`: requests, duration, latency percentiles
-- (microseconds), socket errors and the count of each response status.

local mode = os.getenv("TRAFFIC") or "benign"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local mix = dofile(here .. "mix.lua")
local benign, attacks, format = mix.benign, mix.attacks, mix.format

function init(args)
  counts = {}
  reqs = {}
  for i, a in ipairs(attacks) do
    for _, b in ipairs(benign) do
      table.insert(reqs, format(b))
    end
    if mode == "mixed" then
      table.insert(reqs, format(a))
    end
  end
  n = 0
end

function request()
  n = n + 1
  return reqs[(n - 1) % #reqs + 1]
end
