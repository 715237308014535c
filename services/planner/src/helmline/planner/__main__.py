"""`helmline serve planner`: run the planner service until SIGTERM."""

from helmline.runtime import RuntimeSettings, run_service


def main() -> None:
    """Run the planner service."""
    run_service("planner", RuntimeSettings())


if __name__ == "__main__":
    main()
