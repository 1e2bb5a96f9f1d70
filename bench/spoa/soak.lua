-- wrk script for bench/spoa/soak.py: the soak's mix, paced.
--
-- Every 100 requests: 79 benign (the four of traffic.lua in turn: GETs and a small login
-- form), 20 attacks (SQL injection, XSS in a form body, path traversal, command injection;
-- each denied by CRS at paranoia level 1) and 1 form of 100 KB (a comment of ordinary
-- words), every other one ending in an SQL injection (denied in phase 2 after the whole
-- body was read). SOAK_DELAY_MS: each connection waits this long after each answer (the
-- pace; 0: as fast as the stack answers).
--
-- At the end one line, `RESULT {json}`, as traffic.lua prints it.

local delay_ms = tonumber(os.getenv("SOAK_DELAY_MS") or "0")

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local mix = dofile(here .. "mix.lua")
local benign, attacks, format = mix.benign, mix.attacks, mix.format

local function large_form(tail)
  local words = "the+parcel+arrived+on+time+and+the+shoes+fit+well+thanks+again+"
  local t = { "name=carol&comment=" }
  local n = #t[1]
  while n < 100 * 1024 do
    table.insert(t, words)
    n = n + #words
  end
  table.insert(t, tail)
  return table.concat(t)
end

function init(args)
  counts = {}
  reqs = {}
  local forms = {
    { "POST", "/reviews", large_form("") },
    { "POST", "/reviews", large_form("&rating=1'%20OR%20'1'='1") },
  }
  -- Two blocks of 100 (one form each, the clean one, then the one with the injection).
  for block = 1, 2 do
    for i = 1, 99 do
      if i % 5 == 0 then
        table.insert(reqs, format(attacks[(i / 5 - 1) % #attacks + 1]))
      else
        table.insert(reqs, format(benign[(i - 1) % #benign + 1]))
      end
    end
    table.insert(reqs, format(forms[block]))
  end
  n = 0
end

function request()
  n = n + 1
  return reqs[(n - 1) % #reqs + 1]
end

function delay()
  return delay_ms
end
