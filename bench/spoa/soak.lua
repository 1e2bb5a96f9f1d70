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

local common = {
  ["Host"] = "shop.example.com",
  ["User-Agent"] = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
  ["Accept"] = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
  ["Accept-Language"] = "en-US,en;q=0.5",
  ["Accept-Encoding"] = "gzip, deflate, br",
  ["Cookie"] = "session=8f14e45fceea167a5a36dedd4bea2543; theme=dark",
  ["Referer"] = "https://shop.example.com/",
}

local benign = {
  { "GET", "/products/42?color=blue&size=m&ref=newsletter" },
  { "GET", "/search?q=red+running+shoes&page=2" },
  { "POST", "/account/login", "username=alice&password=correct%20horse%20battery&remember=1" },
  { "GET", "/static/app.js?v=3" },
}

local attacks = {
  { "GET", "/?id=1'%20OR%20'1'='1" },
  { "POST", "/guestbook", "name=bob&comment=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E" },
  { "GET", "/download?file=../../../../etc/passwd" },
  { "GET", "/ping?host=127.0.0.1%3Bcat%20/etc/passwd" },
}

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

local function format(r)
  local h = {}
  for k, v in pairs(common) do h[k] = v end
  if r[3] then
    h["Content-Type"] = "application/x-www-form-urlencoded"
  end
  return wrk.format(r[1], r[2], h, r[3])
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
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

function response(status, headers, body)
  local k = tostring(status)
  counts[k] = (counts[k] or 0) + 1
end

function done(summary, latency, requests)
  local agg = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts") or {}
    for k, v in pairs(c) do
      agg[k] = (agg[k] or 0) + v
    end
  end
  local parts = {}
  for k, v in pairs(agg) do
    table.insert(parts, string.format('"%s":%d', k, v))
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,'
      .. '"mean_us":%.1f,"err_connect":%d,"err_read":%d,"err_write":%d,"err_timeout":%d,'
      .. '"status":{%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean, e.connect, e.read, e.write, e.timeout,
    table.concat(parts, ",")))
end
