"""The launcher a replica actor starts its server through (harness/replica.py): the server dies with the actor."""

# Run by the replica actor as `python -c _LAUNCHER ACTOR_PID CMD...`: set PR_SET_PDEATHSIG=SIGKILL (Linux: the
# server dies with the actor's thread that started it), add the pool's niceness, fork a watchdog, exec the server.
# The watchdog is a child of the server (same pid after exec) that ends it once the actor's pid is gone or reused
# (where no death signal came: another OS, or a pid namespace), and exits once the server is gone; its output goes
# to /dev/null so that nothing finds it by the server's log.
LAUNCHER = (
    "import ctypes, os, signal, sys, time\n"
    "actor = int(sys.argv[1])\n"
    "def started(pid):\n"
    "    try:\n"
    "        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19]\n"
    "    except (OSError, IndexError):\n"
    "        return None\n"
    "if sys.platform.startswith('linux'):\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "os.getppid() == actor or sys.exit(1)\n"
    "os.nice(int(os.environ.pop('SPECGATE_NICE', '0')))\n"  # before exec: every thread of the server inherits it
    "server, actor_start = os.getpid(), started(actor)\n"
    "if os.fork() == 0:\n"
    "    null = os.open(os.devnull, os.O_RDWR)\n"
    "    [os.dup2(null, fd) for fd in (0, 1, 2)]\n"
    "    while os.getppid() == server:\n"
    "        time.sleep(0.5)\n"
    "        try:\n"
    "            os.kill(actor, 0)\n"
    "            gone = started(actor) != actor_start\n"
    "        except ProcessLookupError:\n"
    "            gone = True\n"
    "        except PermissionError:\n"
    "            gone = False\n"
    "        if gone:\n"
    "            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 0)):\n"
    "                try:\n"
    "                    os.kill(server, sig)\n"
    "                except ProcessLookupError:\n"
    "                    break\n"
    "                for _ in range(wait * 10):\n"
    "                    time.sleep(0.1)\n"
    "                    if os.getppid() != server:\n"
    "                        break\n"
    "            break\n"
    "    os._exit(0)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
