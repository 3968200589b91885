# Does a process with the Sanitizer attached (PHOS_VALIDATE=sass) checkpoint?
set -u
d=/dev/shm/sz; rm -rf $d; mkdir -p $d/img $d/plug; cp $PHOS_BUILD/plugin/phos_plugin.so $d/plug/
PHOS_VALIDATE=sass LD_PRELOAD=$PHOS_BUILD/cuda_hooks/libphos.so setsid $PHOS_BUNDLE/gpu/gpu_counter $d/state 64 </dev/null >$d/out 2>&1 &
for i in $(seq 100); do [ -s $d/state ] && break; sleep 0.1; done
pid=$(pgrep -f "gpu_counter $d/state" | head -1); echo "sanitizer probe: pid $pid, state $(cat $d/state 2>/dev/null)"
grep -i "sass\|sanitizer" $d/out | head -3
$CRIU dump -t $pid -D $d/img --lib $d/plug --leave-running -v4 -o dump.log; echo "sanitizer probe: criu dump rc=$?"
grep -E "phos: (Error|Warn)|driver|checkpoint" $d/img/dump.log | head -8
sleep 1; echo "sanitizer probe: after: $(cat $d/state)"; kill $pid
