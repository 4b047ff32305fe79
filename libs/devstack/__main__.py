"""`python -m devstack up [--autoscaled cluster-c] | down [--purge] | status | env | build |
images | kill <c> | start <c>`."""

from __future__ import annotations

import argparse
import sys

from devstack.errors import StackError
from devstack.stack import Stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack",
        description="lockgate's local stack: PostgreSQL, Kafka, two Kubernetes control planes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="install/build what is missing, start everything, wait until "
                        "healthy")
    up.add_argument("--autoscaled", action="append", default=[], metavar="CLUSTER",
                    help="also an autoscaled cluster (cluster-c or cluster-d): no node at first, "
                    "Karpenter makes them; on a running stack only it is started (repeat or "
                    "comma-separate for more; LOCKGATE_AUTOSCALED_CLUSTERS does the same)")
    down = sub.add_parser("down", help="stop what the stack started (keeps data)")
    down.add_argument("--purge", action="store_true", help="also delete the stack's data")
    sub.add_parser("status", help="one line per component; exit 1 if anything is not healthy")
    sub.add_parser("env", help='print shell exports: eval "$(python -m devstack env)"')
    sub.add_parser("build", help="install/build what is missing without starting anything")
    kill = sub.add_parser("kill", help="SIGKILL one component (e.g. kafka, cluster-b/etcd), "
                          "to try an outage")
    kill.add_argument("component")
    start = sub.add_parser("start", help="start one component again and wait until healthy")
    start.add_argument("component")
    sub.add_parser("images", help="build the images of docker-compose.local.yml (cached; starts "
                   "a dockerd of its own for the build if none runs)")
    args = parser.parse_args(argv)
    try:
        asked = [name for value in getattr(args, "autoscaled", []) for name in value.split(",")]
        stack = Stack(autoscaled=asked)
        if args.command == "up":
            stack.up()
        elif args.command == "down":
            stack.down(purge=args.purge)
        elif args.command == "status":
            lines, ok = stack.status()
            print("\n".join(lines))
            return 0 if ok else 1
        elif args.command == "env":
            print("\n".join(stack.env_lines()))
        elif args.command == "kill":
            stack.kill(args.component)
        elif args.command == "start":
            stack.start_component(args.component)
        elif args.command == "images":
            from devstack.compose import build_images
            for name, tag in build_images(stack.s).items():
                print(f"{name}: {tag}")
        elif args.command == "build":
            stack.build()
            print(f"everything is installed; binaries in {stack.s.bin_dir}")
    except StackError as exc:
        print(f"devstack: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("devstack: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
