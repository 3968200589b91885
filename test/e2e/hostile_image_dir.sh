#!/usr/bin/env bash
# The image directory is the user's, and criu runs as root: phos's files are
# never written or read through a link planted in it.
#   1. phos-1-manifest.img planted as a link to a file outside: the dump is
#      refused saying so, the file outside is untouched, the link is still a
#      link, and the process carries on with its gate open;
#   2. the manifest's temporary name planted as a link: the dump succeeds,
#      the file outside is untouched, phos's files are regular and 0600;
#   3. that image's manifest replaced by a link to itself moved outside:
#      the restore is refused saying so; put back, the restore works.
source "$(dirname "$0")/lib.sh"

outside=$WORK/outside
echo precious > "$outside"
untouched() { [ "$(cat "$outside")" = precious ] || fail "the file outside the image directory was written"; }

start_workload --preload
wait_counter_above 5
token=$(state_token)

ln -s "$outside" "$IMG/phos-1-manifest.img"
if criu_dump; then fail "dump succeeded with its manifest's name planted as a link"; fi
grep -q "phos: Error: .*phos-1-manifest.img is a symbolic link in the image directory; not replaced" "$WORK/dump.log" ||
  fail "the dump log does not say the manifest's name is a link: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1)"
untouched
[ -L "$IMG/phos-1-manifest.img" ] || fail "the planted link was replaced"
at=$(state_counter)
wait_counter_above $((at + 10))
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "gate: open" || fail "gate not open after the refused dump"
say "planted manifest link: dump refused ($(grep -o 'phos-1-manifest.img is a symbolic link[^;]*' "$WORK/dump.log" | head -n1)), outside untouched, process carries on"

rm -rf "$IMG" && mkdir -p "$IMG"
ln -s "$outside" "$IMG/phos-1-manifest.img.tmp"
criu_dump || fail "dump failed with a planted temporary link: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1)"
untouched
for f in "$IMG"/phos-1-*.img; do
  [ -f "$f" ] && [ ! -L "$f" ] || fail "$f is not a regular file"
  [ "$(stat -c %a "$f")" = 600 ] || fail "$f is not mode 0600"
done
[ ! -e "$IMG/phos-1-manifest.img.tmp" ] || fail "the temporary name was left behind"
say "planted temporary link: removed, not written through; phos's files regular and 0600"

wait_pid_free
mv "$IMG/phos-1-manifest.img" "$WORK/moved-manifest.img"
ln -s "$WORK/moved-manifest.img" "$IMG/phos-1-manifest.img"
if criu_restore; then fail "restore read a manifest through a link"; fi
grep -q "phos-1-manifest.img is a symbolic link in the image directory; not followed" "$WORK/restore.log" ||
  fail "the restore log does not say the manifest is a link: $(grep -o 'phos: Error: .*' "$WORK/restore.log" | head -n1)"
sleep 0.3
[ -z "$(workload_pids)" ] || fail "a process runs after the refused restore"
rm "$IMG/phos-1-manifest.img" && mv "$WORK/moved-manifest.img" "$IMG/phos-1-manifest.img"
criu_restore || fail "restore failed with the manifest put back"
pid=$(restored_pid) || fail "no restored process"
wait_counter_above $((at + 20))
[ "$(state_token)" = "$token" ] || fail "token changed after restore"
say "manifest as a link: restore refused; put back: restored as pid $pid, counting on"
say "PASS"
