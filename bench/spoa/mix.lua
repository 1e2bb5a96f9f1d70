-- What bench/spoa's wrk scripts share (traffic.lua, soak.lua): the browser-like headers, the
-- benign requests and the attacks, the request formatter, the per-status counts and the
-- `RESULT {json}` line printed at the end (requests, duration, latency percentiles in
-- microseconds, socket errors, the count of each response status).
--
-- Loaded with dofile from the script's own directory; returns the tables, defines wrk's
-- setup, response and done.

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

return { common = common, benign = benign, attacks = attacks, format = format }
