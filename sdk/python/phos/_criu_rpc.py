"""criu's RPC, the few fields a self-dump needs, encoded by hand in
protobuf's wire format (rpc.proto's field numbers): no protobuf runtime and
no copy of CRIU's schema. `criu swrk FD` serves one request on a
SOCK_SEQPACKET socket."""
import os
import socket
import subprocess

# rpc.proto: criu_req, criu_opts, criu_resp.
_DUMP = 1
_REQ_TYPE, _REQ_OPTS = 1, 2
_OPT_IMAGES_DIR_FD, _OPT_PID, _OPT_LEAVE_RUNNING, _OPT_SHELL_JOB = 1, 2, 3, 7
_OPT_LOG_LEVEL, _OPT_LOG_FILE, _OPT_CONFIG_FILE = 9, 10, 51
_RESP_TYPE, _RESP_SUCCESS, _RESP_ERRNO, _RESP_ERRMSG = 1, 2, 7, 9


def _varint(v):
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        out.append(byte | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _int_field(field, v):
    return _varint(field << 3) + _varint(v)


def _bytes_field(field, b):
    return _varint((field << 3) | 2) + _varint(len(b)) + b


def encode_dump(images_dir_fd, pid, leave_running, shell_job, log_file, log_level, config_file=None):
    opts = _int_field(_OPT_IMAGES_DIR_FD, images_dir_fd)
    if pid:  # none: criu dumps the peer of its socket, in its own pid namespace's numbers
        opts += _int_field(_OPT_PID, pid)
    if leave_running:
        opts += _int_field(_OPT_LEAVE_RUNNING, 1)
    if shell_job:
        opts += _int_field(_OPT_SHELL_JOB, 1)
    opts += _int_field(_OPT_LOG_LEVEL, log_level)
    opts += _bytes_field(_OPT_LOG_FILE, log_file.encode())
    if config_file:
        opts += _bytes_field(_OPT_CONFIG_FILE, os.fsencode(config_file))
    return _int_field(_REQ_TYPE, _DUMP) + _bytes_field(_REQ_OPTS, opts)


def _read_varint(data, i):
    v = shift = 0
    while i < len(data):
        byte = data[i]
        i += 1
        v |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return v, i
        shift += 7
    raise ValueError("truncated varint in criu's answer")


def decode_response(data):
    """criu_resp's type, success, errno and message, as a dict."""
    out = {"type": 0, "success": False, "errno": 0, "errmsg": ""}
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(data, i)
            if field == _RESP_TYPE:
                out["type"] = v
            elif field == _RESP_SUCCESS:
                out["success"] = bool(v)
            elif field == _RESP_ERRNO:
                out["errno"] = v
        elif wire == 2:
            n, i = _read_varint(data, i)
            if field == _RESP_ERRMSG:
                out["errmsg"] = data[i:i + n].decode(errors="replace")
            i += n
        else:
            raise ValueError("unexpected wire type %d in criu's answer" % wire)
    return out


def dump_self_service(address, images_dir, leave_running=True, shell_job=True, config_file=None,
                      log_file="dump.log", log_level=4):
    """This process dumped by a running `criu service` at `address`: the way
    for a process criu cannot be started outside of (a pid namespace's init:
    a child it starts, orphaned, comes back to it)."""
    # The service opens the directory through /proc/OUR_PID/fd/FD (criu
    # 4.1 cannot take it by path: it readlink()s that path).
    dirfd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(address)
            # No pid: ours may be another number in the service's namespace.
            s.sendall(encode_dump(dirfd, None, leave_running, shell_job, log_file, log_level, config_file))
            return decode_response(s.recv(65536))
    finally:
        os.close(dirfd)


def dump_self(criu, images_dir, leave_running=True, shell_job=True, config_file=None, log_file="dump.log",
              log_level=4, extra_env=None):
    """This process dumped by criu swrk; criu's answer, as a dict.
    extra_env: added to criu's environment (phos's PHOS_* options)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dirfd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # criu inherits the socket and the directory at the same numbers. It
        # must not be in the tree it dumps ("The criu itself is within dumped
        # tree"): a shell starts it in the background and exits, so it is no
        # child of ours by the time the request comes. And it must not run
        # under libphos.so, which interposes dlsym and would sit inside criu.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env.update(extra_env or {})
        launcher = subprocess.Popen(["/bin/sh", "-c", '"$0" swrk "$1" </dev/null &', criu, str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(), dirfd), stdin=subprocess.DEVNULL, env=env)
        launcher.wait()
        theirs.close()
        ours.sendall(encode_dump(dirfd, os.getpid(), leave_running, shell_job, log_file, log_level, config_file))
        return decode_response(ours.recv(65536))
    finally:
        os.close(dirfd)
        ours.close()
