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
