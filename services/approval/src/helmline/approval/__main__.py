"""`helmline serve approval`: run the approval service until SIGTERM."""

from helmline.runtime import RuntimeSettings, run_service


def main() -> None:
    """Run the approval service."""
    run_service("approval", RuntimeSettings())


if __name__ == "__main__":
    main()
