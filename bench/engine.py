"""The engine benchmark; the same as `python -m nanoengine bench` (see nanoengine/bench.py)."""

from nanoengine.bench import main

if __name__ == "__main__":
    main()
