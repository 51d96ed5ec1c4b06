# Two commands do all the set-up: `make demo` and `make test`. Both bootstrap the pinned venv and the Airflow home.
SHELL := /bin/bash
ROOT := $(CURDIR)
VENV ?= $(ROOT)/.venv
export AIRFLOW_HOME ?= $(ROOT)/.airflow
export TRAINYARD_DATA_DIR ?= $(ROOT)/data
export PATH := $(VENV)/bin:$(PATH)
PIPELINE ?= digits

.PHONY: bootstrap demo data serve stop test test-services unit integration cluster-test images push wheel lint check ui bench clean

bootstrap:
	@VENV=$(VENV) scripts/bootstrap.sh

data: bootstrap
	trainyard data digits

demo: bootstrap data
	trainyard check
	trainyard serve --background
	trainyard run $(PIPELINE)
	trainyard predict $(PIPELINE)

serve: bootstrap
	trainyard serve --background

stop: bootstrap
	trainyard serve --stop

lint: bootstrap
	ruff check contract dags plugins images tests bench

check: bootstrap
	trainyard check

# PostgreSQL, Chromium and Redis (Debian packages) for the integration tests: installed when missing
test-services:
	@scripts/install-test-services.sh

test: bootstrap test-services
	ruff check contract dags plugins images tests bench
	python -m pytest tests --durations=25  # the slowest tests, for keeping CI under its hour

unit: bootstrap
	python -m pytest tests/unit

integration: bootstrap test-services
	python -m pytest tests/integration

# the cluster suite (README "Run on your cluster"): KUBECONFIG=<an admin's kubeconfig> make cluster-test
cluster-test: bootstrap
	@[ -n "$${KUBECONFIG:-}" ] || { echo "cluster-test: set KUBECONFIG to an admin kubeconfig of the cluster" >&2; exit 2; }
	TRAINYARD_KUBE_TEST=1 python -m pytest -rs -s tests/cluster  # -s: the figures each test prints

# the stage images, with docker, podman or buildah (whichever is installed): make images [REGISTRY=registry.example.com/ml]
# tags each also as $(REGISTRY)/trainyard/<stage>:<tag>; make push REGISTRY=... pushes those (kubernetes.registry)
images:
	@REGISTRY=$(REGISTRY) scripts/build-images.sh

push:
	@REGISTRY=$(REGISTRY) scripts/build-images.sh --push

# the wheels an existing Airflow installs (dist/): trainyard (the Airflow side) and trainyard-contract
wheel: bootstrap
	@scripts/build-wheel.sh

ui: bootstrap
	trainyard pools
	airflow standalone

bench: bootstrap test-services
	python -m pip install -q --disable-pip-version-check -c constraints.txt -r bench/requirements.txt
	python bench/parse_bench.py
	python bench/prep_bench.py
	python bench/train_bench.py
	python bench/serving_bench.py
	python bench/stream_bench.py
	python bench/scheduling_bench.py

clean:
	-[ -x $(VENV)/bin/trainyard ] && $(VENV)/bin/trainyard serve --stop
	rm -rf $(AIRFLOW_HOME) $(TRAINYARD_DATA_DIR)
