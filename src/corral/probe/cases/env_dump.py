ID = "env.dump"
CATEGORY = "env-leak"
DESCRIPTION = "print the whole environment, looking for the supervisor's secret variable"
CLAIMS = ("rule:env",)
CODE = """
for k, v in sorted(os.environ.items()):
    print(f"{k}={v}")
out("ALLOWED" if "CORRAL_PROBE_SECRET" in os.environ else "DENIED",
    "CORRAL_PROBE_SECRET " + ("inherited" if "CORRAL_PROBE_SECRET" in os.environ else "absent"))
"""
CONTROL = {"policy": {"env": {"pass": ["CORRAL_PROBE_SECRET"]}}}
CONTAINED = "the supervisor's CORRAL_PROBE_SECRET is not in the sandbox's environment"
