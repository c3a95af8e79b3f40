# The two commands of the README. Both set up .venv themselves on a fresh machine.
.PHONY: memcheck test matrix demo dist bench bench-agents bench-quick lint docs

# The main job: memcheck on the embedded SQLite default. Installs only what it needs (the
# package and Django: scripts/bootstrap.sh --core); `make memcheck REPORT=out/memcheck` also
# writes the run as a page (and installs the plots' matplotlib for it).
memcheck:
	@bash scripts/bootstrap.sh --core $(if $(REPORT),--report)
	@.venv/bin/python manage.py migrate --verbosity 0
	@.venv/bin/python manage.py memcheck $(if $(REPORT),--report $(REPORT))

# The whole test suite on SQLite, MariaDB and PostgreSQL (starts the servers if they are down).
test:
	@bash scripts/test.sh

# The support matrix (noxfile.py): the SQLite suite on every (Python, Django) pair, lint, and the
# wheel installed into a fresh project. `make matrix SESSIONS="-s package"` for one session.
matrix:
	@bash scripts/bootstrap.sh
	@.venv/bin/python -m nox $(SESSIONS)

# The wheel and the sdist into dist/, checked by twine (`make matrix SESSIONS="-s package"`
# installs the wheel into a fresh project and runs memcheck there).
dist:
	@bash scripts/bootstrap.sh
	@rm -rf dist
	@.venv/bin/python -m build --outdir dist
	@.venv/bin/python -m twine check --strict dist/*

# The admin with a few sample memories: http://127.0.0.1:8000/admin/ (admin / admin).
demo:
	@bash scripts/bootstrap.sh
	@.venv/bin/python manage.py migrate --verbosity 0
	@.venv/bin/python manage.py demo
	@.venv/bin/python manage.py runserver

# Benchmarks against the raw drivers and LangGraph's stores: docs/benchmarks.{json,md,png},
# semantic search against LangGraph's: docs/search-benchmarks-sqlite.{json,png}, and the agent
# frameworks' sessions against their own backends: docs/session-benchmarks.{json,md}, and the
# LangGraph checkpointer against LangGraph's: docs/checkpointer-benchmarks.{json,md}, and when the
# Redis tier pays (the database behind a delay proxy): docs/tier-benchmarks.{json,md,png}, and
# agents at once on each stack (make bench-agents): docs/agent-benchmarks.{json,md,png}, and the
# adapters of LlamaIndex, Agent Framework and MCP against their peers: docs/adapter-benchmarks.*,
# and what OpenTelemetry costs the store: docs/telemetry-benchmarks.*, and what sharding costs
# and gives: docs/sharding-benchmarks.*, and the Redis tier on a Redis Cluster against one Redis:
# docs/redis-cluster-benchmarks.*.
bench:
	@bash scripts/bootstrap.sh
	@bash scripts/services.sh
	@.venv/bin/python bench/run.py
	@.venv/bin/python bench/search.py --write
	@.venv/bin/python bench/sessions.py
	@.venv/bin/python bench/adapters.py
	@.venv/bin/python bench/telemetry.py
	@.venv/bin/python bench/sharding.py
	@.venv/bin/python bench/redis_cluster.py
	@.venv/bin/python bench/checkpointers.py
	@.venv/bin/python bench/tier.py
	@.venv/bin/python bench/agent_turns.py

# 1, 8 and 32 agents at once, each turn a session + checkpointer + store turn: agentmemory's stack
# against LangGraph's and the SDK's own, on SQLite and PostgreSQL: docs/agent-benchmarks.*.
bench-agents:
	@bash scripts/bootstrap.sh
	@bash scripts/services.sh
	@.venv/bin/python bench/agent_turns.py

# The same in under a minute, into out/ (CI runs it; it asserts no speed).
bench-quick:
	@bash scripts/bootstrap.sh
	@bash scripts/services.sh
	@.venv/bin/python bench/run.py --quick
	@.venv/bin/python bench/search.py --sizes 1000 --queries 5
	@.venv/bin/python bench/sessions.py --quick
	@.venv/bin/python bench/adapters.py --quick
	@.venv/bin/python bench/telemetry.py --quick
	@.venv/bin/python bench/sharding.py --quick
	@.venv/bin/python bench/redis_cluster.py --quick
	@.venv/bin/python bench/checkpointers.py --quick
	@.venv/bin/python bench/tier.py --quick --rtts 0,1
	@.venv/bin/python bench/agent_turns.py --quick

lint:
	@.venv/bin/python -m ruff check . && .venv/bin/python -m ruff format --check .

# The docs site (mkdocs.yml) into site/, every warning an error; its examples run in `make test`.
docs:
	@bash scripts/bootstrap.sh
	@NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
