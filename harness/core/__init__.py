"""What every stage of the pipeline shares: the events, the cache config,
the comparison of answers (Failure), a trace run's outcome, exit codes,
progress and the list of followed vLLM releases. Imports no other harness
package."""
