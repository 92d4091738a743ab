# failures.awk reads a `go test -v` log and prints, for each test that
# failed, the lines its t.Log/t.Error calls wrote, so a failure's cause is
# shown even when a test logs many lines before it (the summary used to
# show only the lines around "--- FAIL", which a long test's errors are
# far from). Lines saying a real redis-server started are left out: they
# are counted elsewhere and are most of a long test's output. At most the
# last 40 lines of each failed test are printed.
/^=== (RUN|CONT|PAUSE|NAME)[ \t]/ { cur = $3; next }
/^[ \t]*--- (PASS|FAIL|SKIP): / {
  name = $3
  if ($2 == "FAIL:") { failed[++nf] = name }
  next
}
/real redis-server/ { next }
cur != "" && /^[ \t]+[^ \t]+\.go:[0-9]+: / {
  n = ++count[cur]
  lines[cur, n] = $0
}
END {
  for (i = 1; i <= nf; i++) {
    name = failed[i]
    print "--- FAIL: " name
    first = count[name] > 40 ? count[name] - 39 : 1
    if (first > 1) print "    (" first - 1 " earlier lines left out)"
    for (j = first; j <= count[name]; j++) print lines[name, j]
  }
}
