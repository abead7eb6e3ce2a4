"""The dashboard in a real browser (headless Chromium) against three real members.

Each test opens ``/ui/`` on a member's client URL and waits, with a bounded WebDriverWait,
for what the page must show: the members and the right leader (and, after SIGKILL of the
leader, the new one and the dead member); every version of a key after puts and a delete,
and the history starting at the compact revision after a compaction; a FencedLock's queue
with its fencing token, gone after release; with auth on, only the prefix a user may read;
and at 200,000 keys, a key tree that opens by fetching a bounded number of keys (counted by
the page itself: requests and keys received), not the store.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import signal
import threading

import pytest

from kvserver.client import Client
from kvserver.spark.lock import FencedLock
from tests.cluster.harness import call, get, leader_of, put, status, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.external]

WAIT_S = 30.0


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def wait(driver, predicate, what: str, timeout_s: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(
        lambda d: predicate(d), message=f"waiting for {what}"
    )


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver, url: str, view: str = "cluster") -> None:
    driver.get(f"{url}/ui/#{view}")
    wait(
        driver, lambda d: js(d, "return !!(window.raftkvUi && window.raftkvUi.config)"), "the page"
    )


def members_on_page(driver) -> list[dict]:
    return js(
        driver,
        """return [...document.querySelectorAll('#members tbody tr')].map(tr => ({
             id: tr.dataset.memberId, role: tr.dataset.role,
             health: tr.querySelector('.health').textContent}));""",
    )


def click_tree(driver, key: str) -> None:
    sel = f'#tree li[data-key="{b64(key)}"] > span'
    wait(driver, lambda d: js(d, f"return !!document.querySelector('{sel}')"), f"tree item {key}")
    js(driver, f"document.querySelector('{sel}').click()")


def history_rows(driver) -> list[tuple[int, str]]:
    rows = js(
        driver,
        """return [...document.querySelectorAll('#history tbody tr')].map(
             tr => [Number(tr.dataset.revision), tr.dataset.type]);""",
    )
    return [tuple(r) for r in rows]


def test_cluster_view_shows_members_leader_and_failover(cluster, browser, artifacts):
    leader = leader_of(cluster)
    assert leader is not None
    follower = next(n for n in cluster.nodes if n is not leader)
    leader_id = status(leader)["id"]
    for i in range(20):
        put(leader.client_url, f"demo/key{i:02d}", json.dumps({"n": i}))
    open_page(browser, follower.client_url)

    def shows_leader(d):
        rows = members_on_page(d)
        leaders = [r["id"] for r in rows if r["role"] == "leader"]
        return (
            len(rows) == 3
            and leaders == [leader_id]
            and all(r["health"] == "healthy" for r in rows)
        )

    wait(browser, shows_leader, "three healthy members and the leader")
    assert browser.find_element("id", "leader-name").text.endswith(f"({leader_id})")
    # Some load while the charts take a few samples (one every 2 s), for the screenshot.
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            put(leader.client_url, f"load/{i % 50}", str(i))
            get(follower.client_url, f"load/{i % 50}")
            i += 1

    writer = threading.Thread(target=load, daemon=True)
    writer.start()
    try:
        wait(browser, lambda d: js(d, "return window.raftkvUi.samples") >= 5, "five chart samples")
    finally:
        stop.set()
        writer.join(timeout=10)
    assert js(browser, "return document.querySelectorAll('#charts canvas').length") >= 5
    assert console_errors(browser) == []
    browser.save_screenshot(str(artifacts / "ui-cluster.png"))

    cluster.kill(leader, signal.SIGKILL)
    survivors = [n for n in cluster.nodes if n is not leader]
    new_leader = wait_healthy(cluster, timeout_s=60.0, among=survivors)
    new_id = status(new_leader)["id"]
    assert new_id != leader_id

    def shows_failover(d):
        rows = {r["id"]: r for r in members_on_page(d)}
        return (
            len(rows) == 3
            and rows[leader_id]["role"] == "down"
            and rows[leader_id]["health"] == "unreachable"
            and rows[new_id]["role"] == "leader"
        )

    wait(browser, shows_failover, "the new leader and the dead member")
    browser.save_screenshot(str(artifacts / "ui-cluster-failover.png"))


def test_key_history_every_version_then_from_compact_revision(cluster, browser, artifacts):
    url = leader_of(cluster).client_url
    revs = [put(url, "app/config", json.dumps({"replicas": n, "zone": "a"})) for n in (1, 2, 3)]
    status_code, body = call(url, "/v3/kv/deleterange", {"key": b64("app/config")})
    assert status_code == 200
    delete_rev = int(body["header"]["revision"])
    last_rev = put(url, "app/config", json.dumps({"replicas": 5, "zone": "b"}))
    put(url, "app/other", "x")
    expected = [*((r, "PUT") for r in revs), (delete_rev, "DELETE"), (last_rev, "PUT")]

    open_page(browser, url, "keys")
    click_tree(browser, "app/")
    click_tree(browser, "app/config")
    wait(browser, lambda d: history_rows(d) == expected, "every version and the delete")
    put(url, "app/tail", "seen")  # the live tail watches the prefix in view (app/)
    wait(browser, lambda d: "app/tail" in d.find_element("id", "watch-log").text, "the watch tail")
    assert "replicas" in browser.find_element("id", "value").text
    assert browser.find_elements("css selector", "#diff .diff-add")  # v3 -> v5 differs
    browser.save_screenshot(str(artifacts / "ui-key-history.png"))

    status_code, _ = call(url, "/v3/kv/compaction", {"revision": revs[2]})
    assert status_code == 200
    click_tree(browser, "app/other")  # select another key, then this one again
    click_tree(browser, "app/config")
    after = [(revs[2], "PUT"), (delete_rev, "DELETE"), (last_rev, "PUT")]
    wait(browser, lambda d: history_rows(d) == after, "the history from the compact revision")
    assert console_errors(browser) == []


def test_fenced_lock_appears_with_its_token_and_goes_when_released(cluster, browser, artifacts):
    url = leader_of(cluster).client_url
    client = Client([n.client_url for n in cluster.nodes])
    try:
        open_page(browser, url, "pipelines")
        lock = FencedLock(client, "nightly-etl", ttl=10)
        fence = lock.acquire(timeout=20)
        sel = '#locks tbody tr[data-lock="nightly-etl"]'

        def shows_token(d):
            return js(d, f"const r = document.querySelector('{sel}'); return r && r.dataset.token")

        assert wait(browser, shows_token, "the lock and its token") == str(fence.token)
        browser.save_screenshot(str(artifacts / "ui-pipelines.png"))
        # The lock's lease, with its TTL counting down and the lock key attached.
        open_page(browser, url, "leases")
        lease_row = f'#leases tbody tr[data-lease="{lock._lease_id:x}"]'

        def lease_shown(d):
            return js(
                d, f"const r = document.querySelector('{lease_row}'); return r && r.textContent"
            )

        assert "__raftkv/locks/nightly-etl/" in wait(browser, lease_shown, "the lock's lease")
        browser.save_screenshot(str(artifacts / "ui-leases.png"))
        lock.release()
        open_page(browser, url, "pipelines")
        wait(
            browser,
            lambda d: not js(d, f"return !!document.querySelector('{sel}')"),
            "the lock gone",
        )
        assert console_errors(browser) == []
    finally:
        client.close()


def _enable_auth(url: str) -> None:
    steps = [
        ("/v3/auth/user/add", {"name": "root", "password": "rootpw"}),
        ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
        ("/v3/auth/role/add", {"name": "app"}),
        (
            "/v3/auth/role/grant",
            {
                "name": "app",
                "perm": {"permType": "READ", "key": b64("app/"), "range_end": b64("app0")},
            },
        ),
        ("/v3/auth/user/add", {"name": "alice", "password": "alicepw"}),
        ("/v3/auth/user/grant", {"user": "alice", "role": "app"}),
        ("/v3/auth/enable", {}),
    ]
    for path, body in steps:
        code, answer = call(url, path, body)
        assert code == 200, (path, answer)


def test_auth_user_sees_only_the_prefix_it_may_read(cluster, browser, artifacts):
    url = leader_of(cluster).client_url
    for key in ("app/a", "app/b", "secret/x", "zzz"):
        put(url, key, "v")
    _enable_auth(url)
    browser.get(f"{url}/ui/#keys")
    wait(browser, lambda d: d.find_element("id", "login-user").is_displayed(), "the login form")
    browser.find_element("id", "login-user").send_keys("alice")
    browser.find_element("id", "login-password").send_keys("alicepw")
    browser.find_element("id", "login-submit").click()
    click_tree(browser, "app/")
    wait(
        browser,
        lambda d: js(d, "return document.querySelectorAll('#tree li.leaf').length") == 2,
        "the two keys alice may read",
    )
    keys = js(
        browser,
        "return [...document.querySelectorAll('#tree li[data-key]')].map(li => atob(li.dataset.key))",
    )
    assert sorted(keys) == ["app/", "app/a", "app/b"]
    assert not browser.find_element("id", "nav-auth").is_displayed()  # the Auth view is root's
    browser.save_screenshot(str(artifacts / "ui-auth-prefix.png"))
    assert console_errors(browser) == []
    # root sees the Auth view: users with their roles, roles with their permissions.
    browser.find_element("id", "logout").click()
    wait(browser, lambda d: d.find_element("id", "login-user").is_displayed(), "the login form")
    browser.find_element("id", "login-user").send_keys("root")
    browser.find_element("id", "login-password").send_keys("rootpw")
    browser.find_element("id", "login-submit").click()
    wait(
        browser, lambda d: d.find_element("id", "nav-auth").is_displayed(), "the Auth view for root"
    )
    browser.find_element("id", "nav-auth").click()
    role_row = '#roles tbody tr[data-role="app"]'

    def role_text(d):
        return js(
            d, f"const r = document.querySelector('{role_row}'); return r ? r.textContent : ''"
        )

    wait(browser, lambda d: "READ app/*" in role_text(d), "role app with its permission")
    users = js(
        browser, "return [...document.querySelectorAll('#users tbody tr')].map(r => r.dataset.user)"
    )
    assert sorted(users) == ["alice", "root"]


def _load(url: str, count: int, dirs: int) -> None:
    per_dir = count // dirs
    batch = 128  # --max-txn-ops default

    def txn(start: int) -> None:
        ops = []
        for i in range(start, min(start + batch, count)):
            key = f"big/d{i // per_dir:03d}/k{i % per_dir:05d}"
            ops.append({"request_put": {"key": b64(key), "value": b64("v")}})
        code, body = call(url, "/v3/kv/txn", {"success": ops}, timeout_s=30.0)
        assert code == 200, body

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(txn, range(0, count, batch)))


def test_tree_of_200000_keys_opens_one_level_at_a_time(cluster, browser, artifacts):
    url = leader_of(cluster).client_url
    _load(url, 200_000, dirs=200)
    code, body = call(
        url, "/v3/kv/range", {"key": b64("big/"), "range_end": b64("big0"), "count_only": True}
    )
    assert code == 200 and int(body["count"]) == 200_000

    open_page(browser, url, "keys")
    click_tree(browser, "big/")
    wait(
        browser,
        lambda d: (
            js(d, "return document.querySelectorAll('#tree li.dir li.dir').length") == 100
            and js(d, "return !!document.querySelector('#tree li.more')")
        ),
        "the first 100 of big/'s 200 sub-directories and a 'more' item",
    )
    stats = js(browser, "return window.raftkvUi.stats")
    print(f"200,000 keys: opened root and big/ with {stats}")
    # One level at a time: about one small request per child shown, never the keys below.
    assert stats["keysFetched"] <= 1_000, stats
    assert stats["rangeRequests"] <= 250, stats
    click_tree(browser, "big/d000/")
    wait(
        browser,
        lambda d: js(d, "return document.querySelectorAll('#tree li.leaf').length") == 100,
        "the first 100 keys of big/d000/",
    )
    stats2 = js(browser, "return window.raftkvUi.stats")
    assert stats2["keysFetched"] - stats["keysFetched"] <= 400, stats2
    browser.save_screenshot(str(artifacts / "ui-keys-200k.png"))
    assert console_errors(browser) == []
