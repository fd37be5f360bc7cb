"""unstick.agent"""
