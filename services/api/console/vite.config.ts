import { defineConfig } from "vite";

// The API serves the build from dist/; nothing is fetched from elsewhere at run time.
export default defineConfig({
  base: "./",
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false },
});
