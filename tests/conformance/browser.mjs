// The "browser" of `vaultd mcp login` in the conformance suite's auth scenarios ($BROWSER):
// opens the authorization address and follows its redirects, as a person's browser does once
// they approve, back to vaultd's listener on 127.0.0.1. The suite's authorization server
// approves at once.
const url = process.argv[2];
const answer = await fetch(url, { redirect: "follow" });
console.error(`browser: ${answer.status} at ${new URL(answer.url).origin}${new URL(answer.url).pathname}`);
