"""`helmline serve state`: run the state service until SIGTERM."""

from helmline.runtime import RuntimeSettings, run_service


def main() -> None:
    """Run the state service."""
    run_service("state", RuntimeSettings())


if __name__ == "__main__":
    main()
